"""Build the min-cut flow network of a joint graph as arrays.

Every fx node ``n`` becomes two network nodes, ``n_in`` and ``n_out``; the edge between them
costs what saving ``n`` costs. Cutting it means "save n". Infinite edges encode what cannot
be cut: data dependencies, bans on recomputation (source -> n_in) and backward needs
(-> sink). The builder keeps the map from edge index to fx node to read the cut back.

The bans come from ``policy.py``; per-node results (save costs, ban reasons) can be kept
across the solves of one partition in a ``NetworkMemo`` that the caller owns.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import is_sym_node, py_sym_types

from .joint import is_fwd_seed_offset, is_primal
from .mincut import FlowNetwork
from .passes.recompute_tags import must_recompute
from .policy import PolicyContext, ban_reason, can_be_banned, graph_wide_bans
from .sizes import node_nbytes, sym_node_size

log = logging.getLogger(__name__)

SOURCE, SINK = 0, 1
# Capacity for values that are very expensive but not impossible to save (SymFloats).
INT_INF = int(1e6)


@dataclass
class BuiltNetwork:
    """A flow network plus what is needed to explain it and read a cut back."""

    network: FlowNetwork
    edge_nodes: list[fx.Node | None]   # the fx node whose in->out edge this is, else None
    edge_reasons: list[str]            # why an edge exists (shown for infinite edges)
    banned: dict[fx.Node, str] = field(default_factory=dict)  # node -> ban reason


class _Builder:
    """Accumulates vertices, edges and bans; one builder per network."""

    def __init__(self, ctx: PolicyContext, dont_ban: set[fx.Node]) -> None:
        self.ctx = ctx
        self.dont_ban = dont_ban
        self.banned: dict[fx.Node, str] = {}
        self.names = ["source", "sink"]
        # (node, is_out) -> vertex: indices are handed out in first-use order, as by name;
        # keying by node skips building a name string on every lookup.
        self.index: dict[tuple[fx.Node, bool], int] = {}
        self.tails: list[int] = []
        self.heads: list[int] = []
        self.caps: list[float] = []
        self.edge_nodes: list[fx.Node | None] = []
        self.reasons: list[str] = []

    def vertex(self, node: fx.Node, is_out: bool) -> int:
        key = (node, is_out)
        index = self.index.get(key)
        if index is None:
            index = self.index[key] = len(self.names)
            self.names.append(node.name + ("_out" if is_out else "_in"))
        return index

    def edge(self, tail: int, head: int, cap: float, reason: str,
             node: fx.Node | None = None) -> None:
        self.tails.append(tail)
        self.heads.append(head)
        self.caps.append(float(cap))
        self.edge_nodes.append(node)
        self.reasons.append(reason)

    def ban(self, node: fx.Node, reason: str) -> None:
        """Forbid recomputing ``node`` (an infinite source edge) unless it is exempt."""
        if can_be_banned(node, self.ctx, self.dont_ban):
            self.record_ban(node, reason)

    def record_ban(self, node: fx.Node, reason: str) -> None:
        """Add the infinite source edge of a ban already checked against the exemptions."""
        self.banned.setdefault(node, reason)
        self.edge(SOURCE, _in(self, node), math.inf, f"cannot recompute: {reason}")

    def finish(self) -> tuple[FlowNetwork, list[fx.Node | None], list[str]]:
        network = FlowNetwork(
            num_nodes=len(self.names), source=SOURCE, sink=SINK,
            tails=np.asarray(self.tails, dtype=np.int64),
            heads=np.asarray(self.heads, dtype=np.int64),
            capacities=np.asarray(self.caps, dtype=np.float64),
            names=self.names,
        )
        return network, self.edge_nodes, self.reasons


def _in(b: _Builder, node: fx.Node) -> int:
    return b.vertex(node, False)


def _out(b: _Builder, node: fx.Node) -> int:
    return b.vertex(node, True)


def save_cost(node: fx.Node, ctx: PolicyContext) -> tuple[float, str]:
    """Capacity of ``node``'s in->out edge and, for infinite ones, why it cannot be saved."""
    if is_sym_node(node):
        return float(sym_node_size(node)), ""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        if "val" not in node.meta and node.op == "call_function":
            node_nbytes(node)  # raises MissingMetadataError unless the op returns nothing
        if isinstance(val, BackwardState):
            return 0.0, ""
        return math.inf, "cannot save: not a tensor"
    if ctx.treat_params_as_free and node in ctx.node_info.static_lifetime_inputs:
        return 0.0, ""
    if ctx.recompute_views and ctx.op_types.is_view(node):
        return math.inf, "cannot save: view op (recompute_views=True)"
    if isinstance(val, py_sym_types) and not isinstance(val, torch.SymInt):
        return float(INT_INF), "cannot save: SymFloat"
    dist = ctx.node_info.dist_from_bw.get(node, 0)
    # Bias towards saving nodes close to the backward (seed 004's guess of 1.1 per hop).
    cost = int(node_nbytes(node) * (1.1 ** max(min(dist, 100), 1)))
    return float(cost if ctx.is_materialized(node) else cost * 2), ""


class NetworkMemo:
    """Per-node results of ``build_network`` kept across the solves of one partition.

    Save costs and per-node ban reasons read only the node, the classification, the op
    categories, the flags and (ban reasons) the options, none of which change between the
    solves of one partition; the memory-budget search builds the network several times and
    hands the same memo to each. Results are keyed by everything they read, so one memo is
    safe to share between contexts.
    """

    def __init__(self) -> None:
        self._tables: dict[Any, tuple[Any, dict[fx.Node, Any]]] = {}

    def table(self, ctx: PolicyContext, kind: str, with_options: bool) -> dict[fx.Node, Any]:
        """The node -> result cache for ``kind`` under ``ctx``."""
        key = (kind, id(ctx.node_info), id(ctx.op_types), ctx.recompute_views,
               ctx.treat_params_as_free, ctx.max_dist_from_bw,
               ctx.options if with_options else None)
        entry = self._tables.get(key)
        # Holding node_info and op_types keeps their ids unique while the entry lives.
        if entry is None or entry[0][0] is not ctx.node_info or entry[0][1] is not ctx.op_types:
            entry = self._tables[key] = ((ctx.node_info, ctx.op_types), {})
        return entry[1]


def build_network(joint_graph: fx.Graph, ctx: PolicyContext,
                  dont_ban: set[fx.Node] | None = None,
                  memo: NetworkMemo | None = None) -> BuiltNetwork:
    """The flow network for ``joint_graph``, with every ban decided and recorded.

    ``memo``: per-node results from earlier solves of the same partition (see NetworkMemo).
    """
    info = ctx.node_info
    b = _Builder(ctx, dont_ban or set())
    ban = b.ban
    memo = memo if memo is not None else NetworkMemo()
    save_costs = memo.table(ctx, "save_cost", with_options=False)
    ban_reasons = memo.table(ctx, "ban_reason", with_options=True)

    for node in joint_graph.nodes:
        if node.op == "output":
            continue
        if node in info.required_bw:
            if node in info.tangents_closure:
                b.edge(_in(b, node), SINK, math.inf, "must be computed in backward")
                continue
            b.edge(_out(b, node), SINK, math.inf, "must be available for backward")
        if must_recompute(node):
            b.edge(_in(b, node), SINK, math.inf, "must recompute: checkpoint annotation")
            continue
        if is_primal(node):
            ban(node, "primal input")
        elif is_fwd_seed_offset(node):
            ban(node, "forward RNG seed")
        if info.is_required_fw(node):
            if node in ban_reasons:
                reason = ban_reasons[node]
            else:
                reason = ban_reasons[node] = ban_reason(node, ctx)
            if reason is not None:
                ban(node, reason)
        cost_and_why = save_costs.get(node)
        if cost_and_why is None:
            cost_and_why = save_costs[node] = save_cost(node, ctx)
        cost, why = cost_and_why
        b.edge(_in(b, node), _out(b, node), cost, why or "save cost", node)
        for user in node.users:
            b.edge(_out(b, node), _in(b, user), math.inf, f"{user.name} uses {node.name}")

    # Both graph-wide heuristics see the bans made so far, including each other's.
    for node, reason in graph_wide_bans(ctx, b.banned, b.dont_ban):
        b.record_ban(node, reason)
    network, edge_nodes, reasons = b.finish()
    for node, reason in b.banned.items():
        log.debug("banned from recomputation: %s (%s)", node.name, reason)
    return BuiltNetwork(network, edge_nodes, reasons, b.banned)
