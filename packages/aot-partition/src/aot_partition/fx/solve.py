"""One min-cut solve: policy -> fx description -> core network -> solver -> saved values.

``solve_min_cut`` is the reusable step the memory-budget search calls in a loop; the fx joint
graph is described in core terms once per partition (``network.NetworkMemo``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.fx as fx

from ..config import PartitionConfig
from ..core.graph import CorePartition
from ..core.mincut import MinCut, MinCutSolver, get_solver
from .classify import NodeInfo, OpTypes, default_op_types
from .network import NetworkMemo, cut_fx_graph, fx_graph_bans
from .policy import MinCutOptions, PolicyContext

log = logging.getLogger(__name__)


@dataclass
class MinCutSolution:
    saved_values: list[fx.Node]      # in graph order
    banned: dict[fx.Node, str]       # node -> why it may not be recomputed
    core: CorePartition              # the core's answer: network, decisions, cost
    cut: MinCut
    solver: str


def selected_solver(name: str | None = None) -> tuple[str, MinCutSolver]:
    """The solver ``name`` (default: the ``min_cut_solver`` flag).

    "scipy" falls back to networkx, silently, only while its module is not installed.
    """
    name = name if name is not None else PartitionConfig.from_flags().min_cut_solver
    try:
        return name, get_solver(name)
    except ModuleNotFoundError as exc:
        if name == "scipy" and exc.name in ("aot_partition.core.mincut_scipy", "scipy"):
            return "networkx", get_solver("networkx")
        raise


def solve_min_cut(
    joint_graph: fx.Graph,
    node_info: NodeInfo,
    min_cut_options: MinCutOptions,
    dont_ban: set[fx.Node] | None = None,
    *,
    config: PartitionConfig | None = None,
) -> tuple[list[fx.Node], list[fx.Node]]:
    """(saved_values, banned_nodes) of the cheapest cut under ``min_cut_options``.

    ``dont_ban``: nodes whose bans are lifted (the memory-budget search recomputes them).
    """
    solution = solve_min_cut_detailed(joint_graph, node_info, min_cut_options, dont_ban,
                                      config=config)
    return solution.saved_values, list(solution.banned)


def solve_min_cut_detailed(
    joint_graph: fx.Graph,
    node_info: NodeInfo,
    min_cut_options: MinCutOptions,
    dont_ban: set[fx.Node] | None = None,
    op_types: OpTypes | None = None,
    memo: NetworkMemo | None = None,
    *,
    config: PartitionConfig | None = None,
) -> MinCutSolution:
    """Like solve_min_cut, with the reasons, the network and the cut for explanations.

    ``memo``: per-node results shared by the solves of one partition (see NetworkMemo).
    ``config``: the call's frozen flags (default: read the flags now).
    """
    config = config if config is not None else PartitionConfig.from_flags()
    ctx = PolicyContext.create(op_types or default_op_types(), node_info, min_cut_options, config)
    if config.debug:
        print_banned_ops(joint_graph, ctx.op_types)
    solver_name, _ = selected_solver(config.min_cut_solver)
    saved_values, banned, result = cut_fx_graph(joint_graph, ctx, dont_ban, memo, solver_name)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("min-cut (%s) value %s saves %s", solver_name, result.cost,
                  [n.name for n in saved_values])
    return MinCutSolution(saved_values, banned, result, result.cut, solver_name)


def min_cut_bans(joint_graph: fx.Graph, node_info: NodeInfo, min_cut_options: MinCutOptions,
                 dont_ban: set[fx.Node] | None = None, memo: NetworkMemo | None = None, *,
                 config: PartitionConfig | None = None) -> dict[fx.Node, str]:
    """The bans (node -> reason) ``solve_min_cut_detailed`` cuts under with the same
    arguments, without the cut."""
    config = config if config is not None else PartitionConfig.from_flags()
    ctx = PolicyContext.create(default_op_types(), node_info, min_cut_options, config)
    return fx_graph_bans(joint_graph, ctx, dont_ban, memo)


def print_banned_ops(joint_graph: fx.Graph, op_types: OpTypes) -> None:
    """debug_partitioner: list the ops of this graph that may never be rematerialized."""
    ignored = {
        str(node.target._overloadpacket)
        for node in joint_graph.nodes
        if node.op == "call_function" and hasattr(node.target, "_overloadpacket")
        and not op_types.recomputes(node.target._overloadpacket)
    }
    print("Ops banned from rematerialization: ", sorted(ignored))
    print()
