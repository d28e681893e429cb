"""Selective-activation-checkpointing annotations (``node.meta["recompute"]``) and their clean-up."""

from __future__ import annotations

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from ..classify import is_random

RECOMPUTE_POLICIES = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
SAVE_POLICIES = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


def must_recompute(node: fx.Node) -> bool:
    """True for nodes a checkpoint policy asks to recompute (MUST_ or PREFER_RECOMPUTE)."""
    return node.meta.get("recompute") in RECOMPUTE_POLICIES


def must_save(node: fx.Node) -> bool:
    return node.meta.get("recompute") == CheckpointPolicy.MUST_SAVE


def has_recomputable_ops(module: fx.GraphModule) -> bool:
    return any(must_recompute(n) for n in module.graph.nodes)


def has_recomputable_rng_ops(module: fx.GraphModule) -> bool:
    return any(must_recompute(n) and is_random(n) for n in module.graph.nodes)


def cleanup_recompute_tags(joint_module: fx.GraphModule) -> fx.GraphModule:
    """Save the boundary between two consecutive checkpointed regions.

    When a recompute-tagged node feeds a recompute-tagged node of a LATER checkpoint region
    (higher ``ac_graph_id``), the tensor crossing the boundary is marked MUST_SAVE so each region
    is recomputed from its own saved input, as eager checkpointing does. A recomputed region
    output with a backward hook is saved too, since recomputing it would need its own gradient.
    """
    for node in joint_module.graph.nodes:
        if not must_recompute(node):
            continue
        region = node.meta.get("ac_graph_id")
        for user in node.users:
            user_region = user.meta.get("ac_graph_id")
            if (must_recompute(user) and region is not None and user_region is not None
                    and user_region > region):
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        if node.meta.get("has_backward_hook", False) and not any(
            must_recompute(u) for u in node.users
        ):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return joint_module
