"""What the fx ban policy reads, and which of torch's ban rules an options set turns on.

``PolicyContext`` holds one cut's inputs (op categories, classification, options, flags);
``rule_names(options)`` is the one place a ``MinCutOptions`` switches a rule (the names are
``core.rules.RULES``'s). Kept below ``network.py`` (which describes a graph under a context)
and ``policy.py`` (the per-node API over the core's rules).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._higher_order_ops.effects import has_effects

from ..config import MinCutOptions, PartitionConfig
from .classify import NodeInfo, OpTypes


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
    # graph -> its core description under this context (policy.py's per-node answers).
    described: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def create(cls, op_types: OpTypes, node_info: NodeInfo, options: MinCutOptions,
               config: PartitionConfig | None = None) -> PolicyContext:
        """The context of one cut; ``config`` (the call's frozen flags) defaults to the flags."""
        config = config if config is not None else PartitionConfig.from_flags()
        return cls(op_types, node_info, options, config.recompute_views,
                   config.max_dist_from_bw, config.treat_parameters_as_free_to_save)


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


@functools.cache
def node_rule_names(options: MinCutOptions) -> tuple[str, ...]:
    """The per-node rules on under ``options``, in the order reasons are consulted."""
    allowlist = options.ban_if_not_in_allowlist
    switches = {
        "never_recomputable": True,      # recompute must replay the forward exactly
        "collective": options.ban_if_collective,
        "not_in_allowlist": allowlist,
        "random_op": not allowlist,      # without the allowlist, these two stand in for it
        "compute_intensive": not allowlist,
        "materialized_in_backward": options.ban_if_materialized_backward,
        "too_far_from_backward": True,   # max_dist_from_bw (a number) is its switch
        "reduction": options.ban_if_reduction,
    }
    return tuple(name for name, on in switches.items() if on)


@functools.cache
def graph_rule_names(options: MinCutOptions) -> tuple[str, ...]:
    """The graph-wide rules on under ``options``, in the order they run."""
    return tuple(name for name, on in (
        ("ban_used_far_apart", options.ban_if_used_far_apart),
        ("ban_long_fusible_chains", options.ban_if_long_fusible_chains)) if on)


def active_rule_names(options: MinCutOptions) -> tuple[str, ...]:
    """Names of every ban rule on under ``options``: per-node first, then graph-wide."""
    return node_rule_names(options) + graph_rule_names(options)
