"""The default partition of a joint with checkpoint annotations, as torch's does it.

torch's ``default_partition`` honours selective-checkpointing tags itself (a functional
joint): every forward value the backward reads is saved unless its tag asks to recompute it
(MUST_RECOMPUTE, PREFER_RECOMPUTE); MUST_SAVE values are saved; a value outside every
checkpoint region that a region reads is saved (the region's input). The backward recomputes
the rest from what is saved, random ops replaying the forward's RNG state. No memory budget,
no min cut. A joint that mutates anything but its inputs goes to the min-cut partition, as in
torch. Two differences, both for correctness: an impure forward op in a tagged joint is saved
(never recomputed; torch raises an AssertionError), and so is a value read from an input the
step updates in place (recomputing it would read the new contents; torch's trips autograd's
version check there).
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node

from .cut import CutGraphs, finish_cut
from .extract import (
    extract_forward_backward_graphs,
    extract_subgraph,
    is_assert_only_symbool,
)
from .joint import (
    check_topological_order,
    forward_and_backward_outputs,
    is_fwd_seed_offset,
    is_primal,
    is_tangent,
)
from .passes import (
    cleanup_recompute_tags,
    must_recompute,
    must_save,
    save_readers_of_mutated_inputs,
)

log = logging.getLogger(__name__)

# Impure by fx's rule, yet not saved for it: the forward keeps them, the backward needs none.
_SKIPPED_TARGETS = frozenset({torch.ops.aten._assert_scalar.default,
                              torch.ops.aten._assert_async.default,
                              torch.ops.aten._assert_async.msg})
_SKIPPED_PREFIXES = ("profiler._record_function",)  # enter and exit, to keep spans balanced


def _skipped(node: fx.Node) -> bool:
    return node.target in _SKIPPED_TARGETS or str(node.target).startswith(_SKIPPED_PREFIXES)


def mutation_outside_inputs(graph: fx.Graph) -> fx.Node | None:
    """The first op that mutates anything but a graph input (``copy_``/``set_`` into an input
    is how a functional joint writes inputs back), or None for a functional joint."""
    allowed = (torch.ops.aten.copy_.default, torch.ops.aten.set_.source_Tensor)
    for node in graph.nodes:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            continue
        if target in allowed:
            if not (isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"):
                return node
        elif target._schema.is_mutable:
            return node
    return None


def forward_node_names(joint_module: fx.GraphModule, num_fwd_outputs: int) -> set[str]:
    """The forward's nodes by their place in the joint, as torch reads them: every node but the
    tangents up to the last one traced in the forward (``partitioner_tag``). A joint without
    those tags (built by hand) gets the dataflow split: what the forward outputs need."""
    graph = joint_module.graph
    if not any(n.meta.get("partitioner_tag") == "is_forward" for n in graph.nodes):
        inputs = [n for n in graph.nodes if is_primal(n) or is_fwd_seed_offset(n)]
        fw_outputs, _, _, _ = forward_and_backward_outputs(joint_module, num_fwd_outputs)
        return {n.name for n in extract_subgraph(graph, inputs, fw_outputs).nodes
                if n.op != "output"}
    last = None
    for node in graph.nodes:
        if (node.meta.get("partitioner_tag") == "is_forward" or is_primal(node)
                or is_fwd_seed_offset(node)):
            last = node
    names = set()
    for node in graph.nodes:
        if not is_tangent(node) and node.op != "output":
            names.add(node.name)
        if node is last:
            break
    return names


def tagged_saved_values(joint_module: fx.GraphModule, num_fwd_outputs: int
                        ) -> tuple[list[fx.Node], list[fx.Node]]:
    """(saved tensors, saved symbolic scalars) of the default split of a tagged joint: every
    forward value the backward reads that no tag asks to recompute, and every MUST_SAVE one.
    Values nobody reads are dropped by the extraction."""
    graph = joint_module.graph
    forward = forward_node_names(joint_module, num_fwd_outputs)
    submodules = {name for name, _ in joint_module.named_modules()}
    saved: list[fx.Node] = []
    saved_sym: list[fx.Node] = []
    for node in graph.nodes:
        if node.name not in forward or node.op == "output":
            continue
        if (node.op == "get_attr" and node.name in submodules) or _skipped(node):
            continue
        if is_sym_node(node):
            saved_sym.append(node)
            continue
        if node.users and all(u.target is operator.getitem for u in node.users):
            continue  # a tuple: its items are saved (or not) one by one
        if must_save(node) or (node.op != "placeholder" and node.is_impure(impure_random=False)):
            saved.append(node)
            continue
        backward_uses = [u for u in node.users if u.name not in forward]
        if all(is_sym_node(u) for u in backward_uses):
            saved_sym.extend(backward_uses)  # only sizes (or nothing) are read afterwards
            continue
        if not must_recompute(node):
            saved.append(node)
    saved = list(dict.fromkeys(saved))
    saved_sym = [n for n in dict.fromkeys(saved_sym) if not is_assert_only_symbool(n)]
    return saved, saved_sym


def split_tagged_joint(joint_module: fx.GraphModule, num_fwd_outputs: int
                       ) -> CutGraphs | None:
    """The default partition's graphs for a joint with recompute tags (the tags are cleaned up
    in place, as torch does); None for a joint that is not functional (see module doc)."""
    graph = joint_module.graph
    check_topological_order(graph)
    mutation = mutation_outside_inputs(graph)
    if mutation is not None:
        log.warning("checkpoint annotations on a joint that is not functional (%s mutates a "
                    "value that is not an input): using the min-cut partition", mutation.name)
        return None
    # Never recompute from an input updated in place since the forward (as the min-cut does).
    save_readers_of_mutated_inputs(graph)
    cleanup_recompute_tags(graph, save_region_inputs=True)
    saved, saved_sym = tagged_saved_values(joint_module, num_fwd_outputs)
    fw, bw, saved, saved_sym = extract_forward_backward_graphs(
        joint_module, saved, saved_sym, num_fwd_outputs=num_fwd_outputs)
    return finish_cut(CutGraphs(fw, bw, saved, saved_sym))
