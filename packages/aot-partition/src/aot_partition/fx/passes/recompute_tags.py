"""Selective-activation-checkpointing annotations (``node.meta["recompute"]``) and their clean-up."""

from __future__ import annotations

import functools
import logging
import operator
from typing import Any

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

RECOMPUTE_POLICIES = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
SAVE_POLICIES = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)

log = logging.getLogger(__name__)


def must_recompute(node: fx.Node) -> bool:
    """True for nodes a checkpoint policy asks to recompute (MUST_ or PREFER_RECOMPUTE)."""
    return node.meta.get("recompute") in RECOMPUTE_POLICIES


def must_save(node: fx.Node) -> bool:
    return node.meta.get("recompute") == CheckpointPolicy.MUST_SAVE


def has_recomputable_ops(graph: fx.Graph) -> bool:
    """Whether any node ``must_recompute`` (asked of every joint before each partition)."""
    for node in graph.nodes:
        if node.meta.get("recompute") in RECOMPUTE_POLICIES:
            return True
    return False


def _is_item_of_region_op(node: fx.Node) -> bool:
    """A getitem of a multi-output op that belongs to a checkpoint region."""
    if node.target is not operator.getitem or not isinstance(node.args[0], fx.Node):
        return False
    return "ac_graph_id" in node.args[0].meta


def cleanup_recompute_tags(graph: fx.Graph, *, save_region_inputs: bool = False) -> bool:
    """Save the boundary between two consecutive checkpointed regions; True if a tag changed.

    When a recompute-tagged node feeds a recompute-tagged node of a LATER checkpoint region
    (higher ``ac_graph_id``), the tensor crossing the boundary is marked MUST_SAVE so each region
    is recomputed from its own saved input, as eager checkpointing does. A recomputed region
    output with a backward hook is saved too, since recomputing it would need its own gradient.
    ``save_region_inputs`` (the default partition's rule, as in torch): a node outside every
    region that a recompute-tagged node reads is MUST_SAVE as well.
    """
    changed = False
    for node in graph.nodes:
        if not must_recompute(node):
            if (save_region_inputs and "ac_graph_id" not in node.meta
                    and not must_save(node) and not _is_item_of_region_op(node)
                    and any(must_recompute(u) for u in node.users)):
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
                changed = True
            continue
        region = node.meta.get("ac_graph_id")
        for user in node.users:
            user_region = user.meta.get("ac_graph_id")
            if (must_recompute(user) and region is not None and user_region is not None
                    and user_region > region):
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
                changed = True
        if node.meta.get("has_backward_hook", False) and not any(
            must_recompute(u) for u in node.users
        ):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            changed = True
    return changed


def _written_placeholder_args(node: fx.Node, schema: torch.FunctionSchema) -> list[fx.Node]:
    """The graph inputs a functionalized op writes back: its returns are named ``<arg>_out``
    (``running_mean_out``); without such names, conservatively every input argument."""
    written = {r.name[: -len("_out")] for r in schema.returns if r.name.endswith("_out")}
    args = [(a.name, value) for a, value in zip(schema.arguments, node.args)]
    args += [(name, value) for name, value in node.kwargs.items()]
    return [value for name, value in args
            if isinstance(value, fx.Node) and value.op == "placeholder"
            and (not written or name in written)]


def _inputs_returned_as_mutations(graph: fx.Graph) -> set[fx.Node]:
    """Inputs whose new value the forward returns for the runtime to copy back (output
    descriptors ``InputMutationAOTOutput``, matched to the placeholders' descriptors)."""
    output = next(iter(graph.find_nodes(op="output")))
    mutated = [getattr(d, "mutated_input", None) for d in output.meta.get("desc") or ()]
    mutated = [d for d in mutated if d is not None]
    if not mutated:
        return set()
    return {p for p in graph.find_nodes(op="placeholder") if p.meta.get("desc") in mutated}


def _mutated_inputs(graph: fx.Graph) -> tuple[set[fx.Node], set[fx.Node]]:
    """(inputs written back after the forward, inputs written inside the graph).

    After the forward: the runtime copies a new value back, named by the output descriptors,
    or, where a graph has none, guessed from a functionalized op's ``<arg>_out`` returns
    (``aot_module`` without ``keep_inference_input_mutations``). Inside: a ``copy_`` into the
    input (the torch.compile path), which also decides for a functional op writing it.
    """
    functional_writes = _inputs_returned_as_mutations(graph)
    in_graph: set[fx.Node] = set()
    # id(target) -> _is_functionalized: the targets live as long as the graph, and an
    # OpOverload hashes in Python (once per op here, not once per node).
    functional_by_target: dict[int, bool] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if target is torch.ops.aten.copy_.default:
            if node.args[0].op == "placeholder":
                in_graph.add(node.args[0])
            continue
        is_functional = functional_by_target.get(id(target))
        if is_functional is None:
            try:
                is_functional = _is_functionalized(target)
            except TypeError:  # an unhashable target
                is_functional = _is_functionalized.__wrapped__(target)
            functional_by_target[id(target)] = is_functional
        if is_functional:
            functional_writes.update(_written_placeholder_args(node, target._schema))
    return functional_writes - in_graph, in_graph


@functools.cache  # per op: reading a schema's name is slow, and it never changes
def _is_functionalized(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and schema.name.endswith("_functional")


_BATCH_NORM_STATS = ("running_mean", "running_var")


def _only_updates(reader: fx.Node, value: fx.Node) -> bool:
    """Whether ``reader`` reads ``value`` only to compute its new value: a training-mode batch
    norm's running stats (its output and saved statistics come from the batch alone)."""
    schema = getattr(reader.target, "_schema", None)
    if schema is None or "batch_norm" not in schema.name:
        return False
    bound = dict(zip((a.name for a in schema.arguments), reader.args))
    bound.update(reader.kwargs)
    if bound.get("training", True) is not True:  # the *_with_update ops have no flag
        return False
    uses = [name for name, arg in bound.items() if arg is value]
    return bool(uses) and all(name in _BATCH_NORM_STATS for name in uses)


def save_readers_of_mutated_inputs(graph: fx.Graph) -> bool:
    """Mark MUST_SAVE every node whose recompute would read an input after its update; True
    if any node was marked.

    Written back after the forward (``aot_module`` without ``keep_inference_input_mutations``):
    every reader, since autograd's version check fails on the saved input ("modified by an
    inplace operation"; torch's own partitioner crashes there for training-mode batch norm
    under a memory budget). Written inside the forward by a ``copy_``: every reader whose
    value depends on the old contents; a training-mode batch norm does not (it reads its
    running stats only to update them), so it stays recomputable, as in torch.
    """
    after_forward, in_graph = _mutated_inputs(graph)
    if not after_forward and not in_graph:  # the usual case: no reader to look at
        return False
    changed = False
    readers = {user for value in (*after_forward, *in_graph) for user in value.users}
    for node in graph.nodes:  # in graph order: the warnings come in a stable order
        if (node not in readers or node.op != "call_function"
                or node.target is torch.ops.aten.copy_.default):
            continue
        inputs = node.all_input_nodes
        hazard = any(a in after_forward for a in inputs) or any(
            a in in_graph and not _only_updates(node, a) for a in inputs)
        if hazard and not must_save(node):
            if must_recompute(node):
                log.warning("%s reads an input updated in place; saving it despite its %s "
                            "annotation", node.name, node.meta["recompute"])
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            changed = True
    return changed
