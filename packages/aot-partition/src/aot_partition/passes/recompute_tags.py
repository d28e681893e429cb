"""Selective-activation-checkpointing annotations (``node.meta["recompute"]``) and their clean-up."""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from ..classify import is_random

RECOMPUTE_POLICIES = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
SAVE_POLICIES = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)

log = logging.getLogger(__name__)


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


def _written_placeholder_args(node: fx.Node, schema: torch.FunctionSchema) -> list[fx.Node]:
    """The graph inputs a functionalized op writes back: its returns are named ``<arg>_out``
    (``running_mean_out``); without such names, conservatively every input argument."""
    written = {r.name[: -len("_out")] for r in schema.returns if r.name.endswith("_out")}
    args = [(a.name, value) for a, value in zip(schema.arguments, node.args)]
    args += [(name, value) for name, value in node.kwargs.items()]
    return [value for name, value in args
            if isinstance(value, fx.Node) and value.op == "placeholder"
            and (not written or name in written)]


def _mutated_inputs(graph: fx.Graph) -> set[fx.Node]:
    """Graph inputs that are written in place: after the forward (the runtime copies a
    functionalized op's new value back, e.g. batch-norm running stats) or by a ``copy_``."""
    mutated: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.name.endswith("_functional"):
            mutated.update(_written_placeholder_args(node, schema))
        elif node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
            mutated.add(node.args[0])
    return mutated


def save_readers_of_mutated_inputs(joint_module: fx.GraphModule) -> fx.GraphModule:
    """Mark MUST_SAVE every node that reads a graph input the runtime updates in place.

    Recomputing such a node in the backward would read the input after its update, which is
    numerically wrong and trips autograd's version check ("modified by an inplace operation");
    torch's own partitioner does exactly that for training-mode batch norm under a memory budget.
    """
    mutated = _mutated_inputs(joint_module.graph)
    for node in joint_module.graph.nodes:
        if node.op == "call_function" and any(a in mutated for a in node.all_input_nodes):
            if must_recompute(node):
                log.warning("%s reads an input updated in place; saving it despite its %s "
                            "annotation", node.name, node.meta["recompute"])
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return joint_module
