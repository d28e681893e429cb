"""The torch.fx front end of the graph-agnostic core: an fx joint graph described in core terms.

``describe`` turns the joint graph into a ``core.CoreGraph`` once per partition: per node its
inputs, bytes, category, where it is needed (from ``NodeInfo``), checkpoint marks and its fx
save cost (the bias towards the backward and the doubling of fused values read the fx op
categories, so the front end computes them). ``fx_bans`` gives one cut's bans: the per-node
heuristics of ``policy.py`` (memoized per options) and the graph-wide ones, which depend on
the bans before them and on ``dont_ban``. ``core.partition`` builds the network and solves it.

The memory-budget search cuts the same joint several times with different options and
``dont_ban`` sets; a ``NetworkMemo`` that the caller owns keeps the description (and, inside
it, the core's network structure) and the per-options bans across those cuts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import is_sym_node, py_sym_types

from ..core.graph import CoreGraph, CoreNode, CorePartition, partition
from ..errors import PartitionError
from .joint import is_bwd_seed_offset, is_fwd_seed_offset, is_primal, is_random, is_tangent
from .passes.recompute_tags import RECOMPUTE_POLICIES
from .policy import PolicyContext, RuleAnswers, graph_wide_bans, is_effectful
from .sizes import is_opaque, is_opaque_value, node_nbytes, sym_node_size, tensor_nbytes

log = logging.getLogger(__name__)

# Capacity for values that are very expensive but not impossible to save (SymFloats).
INT_INF = int(1e6)
_NOT_A_TENSOR = "cannot save: not a tensor"
# Why an opaque object computed in the forward (a script object an op returns) is saved.
OPAQUE_BAN = "opaque object: never recomputed"


def save_cost(node: fx.Node, ctx: PolicyContext, nbytes: int | None = None
              ) -> tuple[float, str]:
    """Capacity of ``node``'s in->out edge and, for infinite ones, why it cannot be saved.

    ``nbytes``: ``node_nbytes(node)`` when the caller has it already (tensors only)."""
    val = node.meta.get("val")
    if isinstance(val, py_sym_types):  # is_sym_node, with the value already in hand
        return float(sym_node_size(node)), ""
    if not isinstance(val, torch.Tensor):
        if "val" not in node.meta and node.op == "call_function":
            node_nbytes(node)  # raises MissingMetadataError unless the op returns nothing
        if isinstance(val, BackwardState) or is_opaque_value(val):
            return 0.0, ""  # an opaque object is never priced as memory (nor recomputed)
        return math.inf, _NOT_A_TENSOR
    if ctx.treat_params_as_free and node in ctx.node_info.static_lifetime_inputs:
        return 0.0, ""
    if ctx.recompute_views and ctx.op_types.is_view(node):
        return math.inf, "cannot save: view op (recompute_views=True)"
    if isinstance(val, py_sym_types) and not isinstance(val, torch.SymInt):
        return float(INT_INF), "cannot save: SymFloat"
    dist = ctx.node_info.dist_from_bw.get(node, 0)
    # Bias towards saving nodes close to the backward (seed 004's guess of 1.1 per hop).
    nbytes = node_nbytes(node) if nbytes is None else nbytes
    cost = int(nbytes * (1.1 ** max(min(dist, 100), 1)))
    return float(cost if ctx.is_materialized(node) else cost * 2), ""


@dataclass
class FxDescription:
    """An fx joint graph in core terms, plus the maps back to fx nodes."""

    graph: CoreGraph
    nodes: list[fx.Node]              # core position -> fx node
    ban_steps: list[fx.Node]          # nodes the network may ban, in graph order
    exempt: frozenset[fx.Node]        # never banned whatever dont_ban says (can_be_banned)


def _category(node: fx.Node, ctx: PolicyContext, why_unsaveable: str,
              by_target: dict[Any, str]) -> str:
    """The node's core category (see core.CATEGORIES); fx-specific costs are overrides."""
    if node.op == "placeholder":
        if is_tangent(node) or is_bwd_seed_offset(node):
            return "tangent"
        if is_fwd_seed_offset(node):
            return "seed"
        return "parameter" if node in ctx.node_info.static_lifetime_inputs else "input"
    if is_sym_node(node):
        return "symbolic"
    if why_unsaveable == _NOT_A_TENSOR:
        return "opaque"
    try:
        return by_target[node.target]
    except KeyError:
        category = by_target[node.target] = _op_category(node, ctx)
    except TypeError:  # an unhashable target
        category = _op_category(node, ctx)
    return category


def _op_category(node: fx.Node, ctx: PolicyContext) -> str:
    """The category an op's target gives every node that calls it."""
    op_types = ctx.op_types
    if op_types.is_view(node):
        return "view"
    if is_effectful(node, ctx.effects):
        return "effectful"
    if op_types.is_random(node) or is_random(node):
        return "random"
    if op_types.is_compute_intensive(node):
        return "compute"
    return "pointwise" if op_types.is_fusible(node) else "other"


def _nbytes(node: fx.Node, val: Any) -> int:
    # Informative here (the fx save cost is an override): sizing errors surface from
    # save_cost, for the nodes whose size matters, as before.
    if isinstance(val, torch.Tensor):
        return tensor_nbytes(val)
    try:
        return node_nbytes(node)
    except (PartitionError, TypeError):
        return 0


def _describe_node(node: fx.Node, ctx: PolicyContext, by_target: dict[Any, str],
                   exempt_nodes: set[fx.Node]) -> CoreNode:
    """``node`` in core terms; adds it to ``exempt_nodes`` when no ban may apply to it.

    Runs once per joint node: the checks of ``must_recompute`` and ``can_be_banned`` are
    inlined on the meta and value in hand."""
    info = ctx.node_info
    meta = node.meta
    val = meta.get("val")
    if isinstance(val, torch.Tensor):
        is_tensor, nbytes = True, tensor_nbytes(val)
    else:
        is_tensor, nbytes = False, _nbytes(node, val)
    in_backward = node in info.tangents_closure
    annotated_recompute = meta.get("recompute") in RECOMPUTE_POLICIES  # must_recompute
    recompute = not in_backward and annotated_recompute
    if in_backward or recompute:
        cost, why = 0.0, ""
    else:  # a tensor's bytes are known: save_cost need not size it again
        cost, why = save_cost(node, ctx, nbytes if is_tensor else None)
    category = _category(node, ctx, why, by_target)
    # not can_be_banned(node, ctx, ()):
    exempt = (annotated_recompute or ctx.op_types.is_view(node)
              or isinstance(val, torch.SymFloat))
    if exempt:
        exempt_nodes.add(node)
    # Valid by construction (names unique, categories known, sizes >= 0): skip the checks.
    return CoreNode.unchecked(
        id=node.name,
        # node._input_nodes: all_input_nodes without its list copy (see joint.py)
        inputs=tuple([a.name for a in node._input_nodes]),
        nbytes=nbytes,
        category=category,
        forward=node in info.required_fw,
        backward=node in info.required_bw,
        in_backward=in_backward,
        # fx replays a recomputed random op's RNG state (passes/rng.py): its ban is the
        # policy's call; exempt nodes (can_be_banned) get no category ban either.
        allow_recompute=category == "random" or exempt,
        must_recompute=recompute,
        save_cost=None if cost == math.inf else cost,
    )


def describe(joint_graph: fx.Graph, ctx: PolicyContext) -> FxDescription:
    """The core description of ``joint_graph`` (every node but the output)."""
    nodes = [n for n in joint_graph.nodes if n.op != "output"]
    by_target: dict[Any, str] = {}
    exempt: set[fx.Node] = set()
    core_nodes = tuple(_describe_node(n, ctx, by_target, exempt) for n in nodes)
    graph = CoreGraph(core_nodes)
    # The ban step of the network: not for backward nodes nor checkpoint-annotated ones.
    ban_steps = [n for n, c in zip(nodes, core_nodes) if not c.in_backward and not c.must_recompute]
    return FxDescription(graph, nodes, ban_steps, frozenset(exempt))


def _per_node_bans(desc: FxDescription, ctx: PolicyContext,
                   answers: RuleAnswers | None = None) -> list[tuple[fx.Node, str]]:
    """Every per-node ban under ``ctx.options`` (before ``dont_ban``), in graph order.

    ``answers``: the rules' memoized answers, shared by the option sets of one partition."""
    info = ctx.node_info
    answers = answers if answers is not None else RuleAnswers(ctx)
    options = ctx.options
    found = []
    for node in desc.ban_steps:
        if is_primal(node):
            reason: str | None = "primal input"
        elif is_fwd_seed_offset(node):
            reason = "forward RNG seed"
        elif is_opaque(node):
            reason = OPAQUE_BAN
        else:
            reason = answers.reason(node, options) if node in info.required_fw else None
        if reason is not None and node not in desc.exempt:
            found.append((node, reason))
    return found


class NetworkMemo:
    """The description and per-options bans of one joint, kept across the cuts of a partition.

    They read only the graph, the classification, the op categories, the flags and (bans) the
    options, none of which change between the cuts of one partition; the memory-budget search
    hands the same memo to each. Entries are keyed by everything they read, so one memo is safe
    to share between contexts.
    """

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[tuple[Any, ...], Any]] = {}

    def _get(self, key: tuple[Any, ...], holds: tuple[Any, ...], make: Any) -> Any:
        entry = self._entries.get(key)
        # Holding the keyed objects keeps their ids unique while the entry lives.
        if entry is None or any(a is not b for a, b in zip(entry[0], holds)):
            entry = self._entries[key] = (holds, make())
        return entry[1]

    def description(self, joint_graph: fx.Graph, ctx: PolicyContext) -> FxDescription:
        holds = (joint_graph, ctx.node_info, ctx.op_types)
        key = ("describe", *map(id, holds), ctx.recompute_views, ctx.treat_params_as_free)
        return self._get(key, holds, lambda: describe(joint_graph, ctx))

    def rule_answers(self, ctx: PolicyContext) -> RuleAnswers:
        """The per-node rules' answers, shared by every options set (rules ignore options)."""
        holds = (ctx.node_info, ctx.op_types)
        key = ("answers", *map(id, holds), ctx.max_dist_from_bw, ctx.recompute_views,
               ctx.treat_params_as_free)
        return self._get(key, holds, lambda: RuleAnswers(ctx))

    def node_bans(self, desc: FxDescription, ctx: PolicyContext) -> list[tuple[fx.Node, str]]:
        holds = (desc, ctx.node_info, ctx.op_types)
        key = ("bans", *map(id, holds), ctx.options, ctx.max_dist_from_bw,
               ctx.recompute_views, ctx.treat_params_as_free)
        return self._get(key, holds, lambda: _per_node_bans(desc, ctx, self.rule_answers(ctx)))


def fx_bans(desc: FxDescription, ctx: PolicyContext, dont_ban: Collection[fx.Node],
            memo: NetworkMemo) -> dict[fx.Node, str]:
    """One cut's bans, node -> reason: the per-node ones in graph order, then the graph-wide."""
    banned = {n: why for n, why in memo.node_bans(desc, ctx) if n not in dont_ban}
    # Both graph-wide heuristics see the bans made so far, including each other's.
    for node, reason in graph_wide_bans(ctx, banned, dont_ban):
        banned.setdefault(node, reason)
    return banned


def cut_fx_graph(joint_graph: fx.Graph, ctx: PolicyContext, dont_ban: set[fx.Node] | None,
                 memo: NetworkMemo | None, solver: str
                 ) -> tuple[list[fx.Node], dict[fx.Node, str], CorePartition]:
    """(saved values in graph order, bans, the core's answer) of one min cut."""
    memo = memo if memo is not None else NetworkMemo()
    dont_ban = dont_ban or set()
    desc = memo.description(joint_graph, ctx)
    banned = fx_bans(desc, ctx, dont_ban, memo)
    result = partition(desc.graph, solver=solver, bans={n.name: r for n, r in banned.items()},
                       release=[n.name for n in dont_ban if n.op != "output"],
                       recompute_views=ctx.recompute_views,
                       parameters_are_free=ctx.treat_params_as_free)
    if len(result.banned_at) != len(banned):  # the core adds category bans: they must agree
        raise AssertionError(f"fx adapter and core disagree on bans: {len(banned)} vs "
                             f"{len(result.banned_at)}")
    for node, reason in banned.items():
        log.debug("banned from recomputation: %s (%s)", node.name, reason)
    saved = [desc.nodes[i] for i in result.saved_indices.tolist()]
    return saved, banned, result


def fx_core_graph(joint_graph: fx.Graph, ctx: PolicyContext,
                  dont_ban: Collection[fx.Node] = ()) -> CoreGraph:
    """A self-contained core description of one cut: ``describe`` with the cut's bans written
    into the nodes (for tools and tests; the partitioner passes the bans per call instead)."""
    memo = NetworkMemo()
    desc = memo.description(joint_graph, ctx)
    banned = {n.name: why for n, why in fx_bans(desc, ctx, dont_ban, memo).items()}
    released = {n.name for n in dont_ban}
    nodes = [replace(c, ban=banned.get(c.id),
                     allow_recompute=c.allow_recompute or c.id in released)
             for c in desc.graph.nodes]
    return CoreGraph(tuple(nodes))
