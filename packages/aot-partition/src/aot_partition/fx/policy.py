"""Ban heuristics: which forward nodes may not be recomputed in the backward, and why.

Each heuristic is one small predicate returning a human reason (``"reduction: output 4x
smaller than inputs"``) or None, so every decision of the partitioner can be explained. The
two graph-wide heuristics depend on the bans made before them; they take those bans and
return the ones they add, in order (``graph_wide_bans``).

Which heuristics are on is decided in one place: ``active_ban_rules(options)`` and
``active_graph_rules(options)`` list the rules on under a ``MinCutOptions`` (the always-on
ones included). The predicates themselves only test a graph condition, never an option.
"""

from __future__ import annotations

import functools
import heapq
import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._higher_order_ops.effects import has_effects

from ..config import MinCutOptions, PartitionConfig
from .classify import FAR_FROM_BACKWARD, NodeInfo, OpTypes
from .collectives import COLLECTIVE_REASON, is_collective
from .joint import aten_packet, is_random
from .passes.recompute_tags import must_recompute, must_save
from .passes.rng import replay_obstacle
from .sizes import node_nbytes

aten = torch.ops.aten

# A chain of fusible forward ops longer than this many nodes gets cut (torch's constant).
LONG_CHAIN = 100


@dataclass(frozen=True)
class PolicyContext:
    """What the predicates read: categories, classification, options and two flags."""

    op_types: OpTypes
    node_info: NodeInfo
    options: MinCutOptions
    recompute_views: bool
    max_dist_from_bw: int
    treat_params_as_free: bool = False  # static-lifetime inputs (parameters) cost 0 to save
    # op -> has a side effect, asked once per op of this context (and of its ``replace``s):
    # torch's check reads the op's schema and the effect registry each time.
    effects: dict[Any, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def create(cls, op_types: OpTypes, node_info: NodeInfo, options: MinCutOptions,
               config: PartitionConfig | None = None) -> PolicyContext:
        """The context of one cut; ``config`` (the call's frozen flags) defaults to the flags."""
        config = config if config is not None else PartitionConfig.from_flags()
        return cls(op_types, node_info, options, config.recompute_views,
                   config.max_dist_from_bw, config.treat_parameters_as_free_to_save)

    def is_fusible(self, producer: fx.Node, consumer: fx.Node) -> bool:
        # Memory can be fused into a cat, but a cat cannot produce into a fusion.
        if aten_packet(consumer) is aten.cat:
            return True
        return self.op_types.is_fusible(producer) and self.op_types.is_fusible(consumer)

    def is_materialized(self, node: fx.Node) -> bool:
        """Whether ``node``'s value exists in memory anyway (an input, or an unfusible use)."""
        if node.op == "placeholder":
            return True
        return not all(self.is_fusible(node, user) for user in node.users)


Predicate = Callable[[fx.Node, PolicyContext], "str | None"]


# ---- one predicate per heuristic -------------------------------------------------------------

def is_effectful(node: fx.Node, memo: dict[Any, bool] | None = None) -> bool:
    """An op with a side effect (threaded through effect tokens once functionalized).

    ``memo``: op -> answer, kept by the caller for one partition (an effect registered
    meanwhile is seen by the next one)."""
    target = node.target
    if target is torch.ops.higher_order.with_effects:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if memo is None:
        return has_effects(target)
    try:
        return memo[target]
    except KeyError:
        effectful = memo[target] = has_effects(target)
        return effectful


def never_recompute(node: fx.Node, effects: dict[Any, bool] | None = None) -> str | None:
    """Why ``node`` may never be recomputed, whatever the options or the budget, or None.

    Recompute must be a pure replay of the forward: these nodes would not give the forward's
    value again (or would repeat a side effect). The budget search never releases them.
    """
    if must_save(node):
        return "MUST_SAVE annotation"
    obstacle = replay_obstacle(node)
    if obstacle is not None:
        return obstacle
    if is_effectful(node, effects):
        return "effectful op: recomputing would repeat its side effect"
    return None


def never_recomputable(node: fx.Node, ctx: PolicyContext) -> str | None:
    return never_recompute(node, ctx.effects)


def collective(node: fx.Node, ctx: PolicyContext) -> str | None:
    """A functional collective or its wait (collectives.py); on unless the flag
    ``allow_recompute_collectives`` is set. Unlike the heuristics, the budget search never
    releases it (``never_released``); a checkpoint annotation still wins, as in torch."""
    return COLLECTIVE_REASON if is_collective(node) else None


def never_released(node: fx.Node, options: MinCutOptions) -> str | None:
    """Why the memory-budget search may never release ``node``'s ban under ``options``: a
    ``never_recompute`` reason, or the collective ban when it is on; else None."""
    reason = never_recompute(node)
    if reason is None and options.ban_if_collective and is_collective(node):
        reason = COLLECTIVE_REASON
    return reason


def not_in_allowlist(node: fx.Node, ctx: PolicyContext) -> str | None:
    if not ctx.op_types.is_recomputable(node):
        return f"not in allowlist: {aten_packet(node)} is not a recomputable op"
    return None


def random_op(node: fx.Node, ctx: PolicyContext) -> str | None:
    """On only without the allowlist (which already bans every random op)."""
    # Recomputing would replay the forward's RNG state (passes/rng.py): correct, but it costs
    # a saved state and a second draw, so only the memory budget lifts this ban.
    if ctx.op_types.is_random(node) or is_random(node):
        return "random op: recomputing costs a second draw and a saved RNG state"
    return None


def compute_intensive(node: fx.Node, ctx: PolicyContext) -> str | None:
    """On only without the allowlist (which already bans every compute-intensive op)."""
    if ctx.op_types.is_compute_intensive(node):
        return f"compute-intensive op: {aten_packet(node)}"
    return None


def materialized_in_backward(node: fx.Node, ctx: PolicyContext) -> str | None:
    """A node the backward must materialize anyway is never free to recompute."""
    if ctx.op_types.is_view(node):
        return None
    pending = [node]
    seen = {node}
    while pending:
        cur = pending.pop()
        for user in cur.users:
            if not ctx.node_info.is_required_fw(user) and not ctx.is_fusible(cur, user):
                return f"materialized in backward: used unfused by {user.name}"
            if ctx.op_types.is_view(user) and user not in seen:
                seen.add(user)
                pending.append(user)
    return None


def too_far_from_backward(node: fx.Node, ctx: PolicyContext) -> str | None:
    """A forward node more than ``max_dist_from_bw`` hops from its nearest backward user.

    Nodes that never reach the backward (``FAR_FROM_BACKWARD``) are exempt: nothing would
    recompute them. torch stands for that with ``dist < 1000``, which at its default
    ``max_dist_from_bw = 1000`` (and at any value from 999 up) leaves no distance to ban, so
    its rule never fires unless the flag is lowered. Here the flag means what it documents at
    every value; the default bans only nodes more than 1,000 hops away (the model zoo and a
    32-block GPT stay within 10 hops).
    """
    dist = ctx.node_info.dist_from_bw.get(node, 0)
    if ctx.max_dist_from_bw < dist < FAR_FROM_BACKWARD:
        return f"too far from backward: {dist} ops > max_dist_from_bw={ctx.max_dist_from_bw}"
    return None


def reduction(node: fx.Node, ctx: PolicyContext) -> str | None:
    """Saving a small reduction output is cheap; recomputing it (e.g. a norm) is not."""
    input_bytes = sum(node_nbytes(a) for a in node.args if isinstance(a, fx.Node))
    output_bytes = node_nbytes(node)
    if output_bytes * 4 < input_bytes:
        ratio = input_bytes / max(output_bytes, 1)
        return f"reduction: output {ratio:.0f}x smaller than inputs"
    return None


# Every per-node rule, by name. Order matters only for which reason is reported first; it
# follows torch.
NODE_PREDICATES: tuple[Predicate, ...] = (
    never_recomputable,
    collective,
    not_in_allowlist,
    random_op,
    compute_intensive,
    materialized_in_backward,
    too_far_from_backward,
    reduction,
)

NodeRule = tuple[str, Predicate]


@functools.cache
def active_ban_rules(options: MinCutOptions) -> tuple[NodeRule, ...]:
    """(name, predicate) of every per-node ban rule on under ``options``, in the order
    ``ban_reason`` consults them. The one place an option switches a per-node rule."""
    allowlist = options.ban_if_not_in_allowlist
    switches: dict[Predicate, bool] = {
        never_recomputable: True,        # recompute must replay the forward exactly
        collective: options.ban_if_collective,
        not_in_allowlist: allowlist,
        random_op: not allowlist,        # without the allowlist, these two stand in for it
        compute_intensive: not allowlist,
        materialized_in_backward: options.ban_if_materialized_backward,
        too_far_from_backward: True,     # max_dist_from_bw (a number) is its switch
        reduction: options.ban_if_reduction,
    }
    return tuple((p.__name__, p) for p in NODE_PREDICATES if switches[p])


def _never_banned(node: fx.Node, ctx: PolicyContext) -> bool:
    if node.op != "call_function" or node.target is operator.getitem:
        return True
    if must_save(node) or is_effectful(node, ctx.effects):
        return False
    if ctx.recompute_views and ctx.op_types.is_view(node):
        return True
    return node.target in (aten.lift_fresh_copy.default, aten.lift_fresh.default)


def ban_reason(node: fx.Node, ctx: PolicyContext) -> str | None:
    """Why ``node`` may not be recomputed, or None (per-node heuristics only)."""
    if _never_banned(node, ctx):
        return None
    for _, predicate in active_ban_rules(ctx.options):
        reason = predicate(node, ctx)
        if reason is not None:
            return reason
    return None


class RuleAnswers:
    """Each per-node rule's answer for each node, each computed at most once.

    The cuts of one partition (the memory-budget search makes up to four) differ only in
    which rules are on; a rule's answer reads the graph, the classification, the op
    categories and the two flags of ``ctx``, never the options. So ``reason(node, options)``
    equals ``ban_reason`` under a context with those options, and a later options set only
    asks the rules an earlier one did not reach. Valid for one ``ctx`` (options aside).
    """

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self._never_banned: dict[fx.Node, bool] = {}
        self._answers: dict[Predicate, dict[fx.Node, str | None]] = {
            p: {} for p in NODE_PREDICATES}

    def reason(self, node: fx.Node, options: MinCutOptions) -> str | None:
        """``ban_reason(node, ctx)`` with ``options`` in place of ``ctx.options``."""
        never = self._never_banned.get(node)
        if never is None:
            never = self._never_banned[node] = _never_banned(node, self.ctx)
        if never:
            return None
        for _, predicate in active_ban_rules(options):
            answers = self._answers[predicate]
            try:
                reason = answers[node]
            except KeyError:
                reason = answers[node] = predicate(node, self.ctx)
            if reason is not None:
                return reason
        return None


def can_be_banned(node: fx.Node, ctx: PolicyContext, dont_ban: Collection[fx.Node]) -> bool:
    """Whether a ban may apply: views, annotated recomputes, SymFloats and dont_ban are exempt."""
    if ctx.op_types.is_view(node) or node in dont_ban or must_recompute(node):
        return False
    return not isinstance(node.meta.get("val"), torch.SymFloat)


# ---- graph-wide heuristics (they depend on the bans made so far) -----------------------------

def _first_unfusible_use(ctx: PolicyContext, start: list[fx.Node], max_order: int) -> int:
    info = ctx.node_info
    heap: list[tuple[int, int, bool, fx.Node]] = []
    pushed: set[tuple[fx.Node, bool]] = set()
    tie = 0
    for node in start:
        heapq.heappush(heap, (info.get_fw_order(node), tie, True, node))
        tie += 1
        pushed.add((node, True))
    while heap:
        order, _, fusible, node = heapq.heappop(heap)
        if not fusible:
            return order
        for user in node.users:
            if info.is_required_fw(user) and info.get_fw_order(user) <= max_order:
                entry = (user, ctx.is_fusible(node, user))
                if entry not in pushed:
                    pushed.add(entry)
                    heapq.heappush(heap, (info.get_fw_order(user), tie, entry[1], user))
                    tie += 1
    return max_order


Bans = list[tuple[fx.Node, str]]


def _ban(node: fx.Node, reason: str, ctx: PolicyContext, banned: dict[fx.Node, str],
         dont_ban: Collection[fx.Node], made: Bans) -> None:
    if can_be_banned(node, ctx, dont_ban):
        banned.setdefault(node, reason)
        made.append((node, reason))


def ban_used_far_apart(ctx: PolicyContext, banned: dict[fx.Node, str],
                       dont_ban: Collection[fx.Node] = ()) -> Bans:
    """Ban fusible users of a value that come after an unfusible use of it.

    Recomputing both a near and a far user of one value rarely fuses, so the far one is saved.
    ``banned``: the bans so far, extended with the ones made here; returns those, in order.
    """
    info = ctx.node_info
    made: Bans = []
    for used in info.required_fw_nodes:
        fw_users = [u for u in used.users if info.is_required_fw(u)]
        if not fw_users:
            continue
        last = max(info.get_fw_order(u) for u in fw_users)
        first_unfusible = _first_unfusible_use(ctx, fw_users, last)
        for user in used.users:
            if (info.is_required_fw(user) and info.get_fw_order(user) > first_unfusible
                    and ctx.is_fusible(used, user) and user not in banned):
                _ban(user, f"used far apart: {used.name} is used before and after an "
                     "unfusible op", ctx, banned, dont_ban, made)
    return made


def ban_long_fusible_chains(ctx: PolicyContext, banned: dict[fx.Node, str],
                            dont_ban: Collection[fx.Node] = ()) -> Bans:
    """Cut chains of fusible forward ops longer than LONG_CHAIN (e.g. residual streams).

    ``banned``: the bans so far, extended with the ones made here; returns those, in order.
    """
    info = ctx.node_info
    made: Bans = []
    visited: set[fx.Node] = set()
    for start in info.required_fw_nodes:
        start_order = info.get_fw_order(start)
        heap = [(start_order, start.name, start)]
        while heap:
            order, _, cur = heapq.heappop(heap)
            if cur in visited:
                continue
            visited.add(cur)
            if order > start_order + LONG_CHAIN and not heap:
                _ban(cur, f"long fusible chain: {order - start_order} fusible ops from "
                     f"{start.name}", ctx, banned, dont_ban, made)
                break
            for user in cur.users:
                if (info.is_required_fw(user) and ctx.is_fusible(cur, user)
                        and user not in banned):
                    heapq.heappush(heap, (info.get_fw_order(user), user.name, user))
    return made


GraphRule = tuple[str, Callable[[PolicyContext, dict[fx.Node, str], Collection[fx.Node]], Bans]]


@functools.cache
def active_graph_rules(options: MinCutOptions) -> tuple[GraphRule, ...]:
    """(name, heuristic) of each graph-wide ban rule on under ``options``, in the order
    ``graph_wide_bans`` runs them. The one place an option switches a graph-wide rule."""
    rules: list[GraphRule] = []
    if options.ban_if_used_far_apart:
        rules.append(("ban_used_far_apart", ban_used_far_apart))
    if options.ban_if_long_fusible_chains:
        rules.append(("ban_long_fusible_chains", ban_long_fusible_chains))
    return tuple(rules)


def active_rule_names(options: MinCutOptions) -> tuple[str, ...]:
    """Names of every ban rule on under ``options``: per-node first, then graph-wide."""
    return tuple(name for name, _ in (*active_ban_rules(options), *active_graph_rules(options)))


def graph_wide_bans(ctx: PolicyContext, banned: Mapping[fx.Node, str],
                    dont_ban: Collection[fx.Node] = ()) -> Bans:
    """The bans of the active graph-wide heuristics, given the per-node ``banned`` so far
    (not modified). Each heuristic sees the bans before it, the other's included."""
    so_far = dict(banned)
    made: Bans = []
    for _, rule in active_graph_rules(ctx.options):
        made += rule(ctx, so_far, dont_ban)
    return made
