"""One min-cut solve: policy -> network -> solver -> saved values.

``solve_min_cut`` is the reusable step the memory-budget search calls in a loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.fx as fx

from .classify import NodeInfo, OpTypes, default_op_types
from .config import PartitionConfig
from .errors import InfeasibleMinCutError
from .mincut import MinCut, MinCutSolver, get_solver, infinite_path
from .network import BuiltNetwork, NetworkMemo, build_network
from .policy import MinCutOptions, PolicyContext

log = logging.getLogger(__name__)


@dataclass
class MinCutSolution:
    saved_values: list[fx.Node]      # in graph order
    banned: dict[fx.Node, str]       # node -> why it may not be recomputed
    built: BuiltNetwork
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
        if name == "scipy" and exc.name in ("aot_partition.mincut_scipy", "scipy"):
            return "networkx", get_solver("networkx")
        raise


def _raise_infeasible(built: BuiltNetwork, path_edges: list[int]) -> None:
    network = built.network
    steps: list[tuple[str, str]] = []
    for e in path_edges:
        head = network.names[int(network.heads[e])]
        node_name = head.removesuffix("_in").removesuffix("_out")
        steps.append((node_name, built.edge_reasons[e]))
    raise InfeasibleMinCutError(steps)


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
    built = build_network(joint_graph, ctx, dont_ban, memo)
    path = infinite_path(built.network)
    if path is not None:
        _raise_infeasible(built, path)
    solver_name, solver = selected_solver(config.min_cut_solver)
    cut = solver(built.network)
    if cut.value == float("inf"):
        raise AssertionError(f"solver {solver_name!r} found no finite cut on a feasible network")
    order = {node: i for i, node in enumerate(joint_graph.nodes)}
    saved = {built.edge_nodes[e] for e in cut.cut_edges(built.network).tolist()}
    if None in saved:
        raise AssertionError(f"solver {solver_name!r} cut an infinite edge")
    saved_values = sorted(saved, key=order.__getitem__)
    log.debug("min-cut (%s) value %s saves %s", solver_name, cut.value,
              [n.name for n in saved_values])
    return MinCutSolution(saved_values, built.banned, built, cut, solver_name)


def print_banned_ops(joint_graph: fx.Graph, op_types: OpTypes) -> None:
    """debug_partitioner: list the ops of this graph that may never be rematerialized."""
    ops = {
        str(node.target._overloadpacket)
        for node in joint_graph.nodes
        if node.op == "call_function" and hasattr(node.target, "_overloadpacket")
    }
    ignored = ops - {str(op) for op in op_types.recomputable_ops}
    print("Ops banned from rematerialization: ", sorted(ignored))
    print()
