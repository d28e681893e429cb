"""The fx side of the ban policy: which forward nodes may not be recomputed, and why.

The heuristics themselves are the core's named rules (``core.rules``), read off the fx graph's
core description (``network.describe``); this module answers per fx node, for tools, tests and
the budget search. What only fx can see stays here: ``never_recompute`` (SAC tags, RNG state
that cannot be replayed, side effects) and ``collective`` (functional collectives); the
description hands both to the core as bans and categories.

Which rules are on is decided in one place (``context.rule_names``): ``active_ban_rules`` and
``active_graph_rules`` list the rules on under a ``MinCutOptions`` (the always-on ones
included). The predicates only test a graph condition, never an option.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.fx as fx

from ..config import MinCutOptions
from ..core import rules as core_rules
from ..core.rules import COLLECTIVE_REASON, LONG_CHAIN
from .collectives import is_collective
from .context import (
    PolicyContext,
    active_rule_names,
    graph_rule_names,
    is_effectful,
    node_rule_names,
)
from .network import FxDescription, describe
from .passes.recompute_tags import must_recompute, must_save
from .passes.rng import replay_obstacle

__all__ = [
    "LONG_CHAIN",
    "MinCutOptions",
    "PolicyContext",
    "active_ban_rules",
    "active_graph_rules",
    "active_rule_names",
    "ban_reason",
    "can_be_banned",
    "is_effectful",
    "never_recompute",
    "never_released",
]

aten = torch.ops.aten

Predicate = Callable[[fx.Node, PolicyContext], "str | None"]


# ---- what only fx can see ----------------------------------------------------------------

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
        return core_rules.EFFECTFUL_REASON
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


# ---- the core's rules, asked per fx node -------------------------------------------------

def description(ctx: PolicyContext, graph: fx.Graph) -> FxDescription:
    """``graph`` in core terms under ``ctx`` (described once per graph and context)."""
    key = (id(graph), ctx.recompute_views, ctx.treat_params_as_free)
    entry = ctx.described.get(key)
    if entry is None or entry[0] is not graph:
        entry = ctx.described[key] = (graph, describe(graph, ctx))
    return entry[1]


def _core_rule(name: str) -> Predicate:
    check = core_rules.RULES[name].check
    assert check is not None

    def predicate(node: fx.Node, ctx: PolicyContext) -> str | None:
        desc = description(ctx, node.graph)
        position = desc.positions.get(node)
        if position is None:  # the output node: not a value, never recomputed
            return None
        return check(desc.graph, position, ctx.max_dist_from_bw)

    predicate.__name__ = predicate.__qualname__ = name
    predicate.__doc__ = f"The core rule ``{name}`` (core/rules.py) on ``node``."
    return predicate


not_in_allowlist = _core_rule("not_in_allowlist")
random_op = _core_rule("random_op")
compute_intensive = _core_rule("compute_intensive")
materialized_in_backward = _core_rule("materialized_in_backward")
too_far_from_backward = _core_rule("too_far_from_backward")
reduction = _core_rule("reduction")

# Every per-node rule, by name, in the order reasons are consulted (torch's).
NODE_PREDICATES: dict[str, Predicate] = {p.__name__: p for p in (
    never_recomputable, collective, not_in_allowlist, random_op, compute_intensive,
    materialized_in_backward, too_far_from_backward, reduction)}

NodeRule = tuple[str, Predicate]
GraphRule = tuple[str, Callable[..., None]]


@functools.cache
def active_ban_rules(options: MinCutOptions) -> tuple[NodeRule, ...]:
    """(name, predicate) of every per-node ban rule on under ``options``, in the order
    ``ban_reason`` consults them."""
    return tuple((name, NODE_PREDICATES[name]) for name in node_rule_names(options))


@functools.cache
def active_graph_rules(options: MinCutOptions) -> tuple[GraphRule, ...]:
    """(name, the core's sweep) of each graph-wide ban rule on under ``options``, in the order
    they run (they read the bans made before them; see core/rules.py)."""
    rules: list[GraphRule] = []
    for name in graph_rule_names(options):
        sweep = core_rules.RULES[name].sweep
        assert sweep is not None
        rules.append((name, sweep))
    return tuple(rules)


def _never_banned(node: fx.Node, ctx: PolicyContext) -> bool:
    if node.op != "call_function" or node.target is operator.getitem:
        return True
    if must_save(node) or is_effectful(node, ctx.effects):
        return False
    if ctx.recompute_views and ctx.op_types.is_view(node):
        return True
    return node.target in (aten.lift_fresh_copy.default, aten.lift_fresh.default)


def ban_reason(node: fx.Node, ctx: PolicyContext) -> str | None:
    """Why ``node`` may not be recomputed, or None (per-node rules only)."""
    if _never_banned(node, ctx):
        return None
    for _, predicate in active_ban_rules(ctx.options):
        reason = predicate(node, ctx)
        if reason is not None:
            return reason
    return None


def can_be_banned(node: fx.Node, ctx: PolicyContext, dont_ban: Collection[fx.Node]) -> bool:
    """Whether a ban may apply: views, annotated recomputes, SymFloats and dont_ban are exempt."""
    if ctx.op_types.is_view(node) or node in dont_ban or must_recompute(node):
        return False
    return not isinstance(node.meta.get("val"), torch.SymFloat)
