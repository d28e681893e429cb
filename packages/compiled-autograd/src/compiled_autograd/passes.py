"""Clean-up passes run on a captured backward graph before it reaches ``compiler_fn``.

Each pass is one function from graph to graph (mutating in place), in the order
:func:`run_all` applies them. Node kinds are recognised by target (see
:mod:`compiled_autograd.graph_ops`) and, for hooks, by the ``hook_type`` keyword.

Why the reordering: AOTAutograd backwards are pasted into the graph as one block, so the
accumulate-grad and hook nodes of the parameters they produce land after the whole block. Eager
autograd runs them as soon as their gradient exists; moving each right after its last input
restores eager's order (and frees gradients earlier).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Sequence

import torch
from torch import fx

from compiled_autograd.graph_ops import (
    IMPURE_TARGETS,
    call_accumulate_grad,
    call_hook,
)
from compiled_autograd.logs import verbose_log

logger = logging.getLogger(__name__)

PLACEHOLDERS = ("inputs", "sizes", "scalars", "hooks", "packed_data")


def _nodes_in(args: Iterable[object]) -> list[fx.Node]:
    return [a for a in args if isinstance(a, fx.Node)]


def _node_arg(node: fx.Node, index: int) -> fx.Node:
    """``node.args[index]`` where the capture always puts a node (a hook, a gradient, ...)."""
    arg = node.args[index]
    assert isinstance(arg, fx.Node), f"{node.format_node()}: args[{index}] is not a node"
    return arg


def _sequence_arg(node: fx.Node, index: int) -> Sequence[fx.node.Argument]:
    """``node.args[index]`` where the capture always puts a list or tuple (of gradients)."""
    arg = node.args[index]
    assert isinstance(arg, (list, tuple)), f"{node.format_node()}: args[{index}] is no sequence"
    return arg


def _hooks_of(graph: fx.Graph, hook_type: str) -> list[fx.Node]:
    return [n for n in graph.find_nodes(op="call_function", target=call_hook)
            if n.kwargs.get("hook_type") == hook_type]


def _is_unpacked_input(node: fx.Node) -> bool:
    """A placeholder, or ``placeholder[i]``: there is nothing earlier to schedule after."""
    if node.op == "placeholder":
        return True
    return (node.op == "call_function" and node.target is operator.getitem
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder")


def strip_fake_metadata(graph: fx.Graph) -> None:
    """Capture traced dummy tensors; their metadata would mislead later compilers."""
    for node in graph.nodes:
        for key in ("tensor_meta", "example_value", "val"):
            node.meta.pop(key, None)


def delay_unpack_hooks(graph: fx.Graph) -> None:
    """Saved-tensor unpack hooks run right before their first use (later than eager: fine)."""
    for node in _hooks_of(graph, "unpack_hook"):
        if node.users:
            min(node.users).prepend(node)


def reorder_tensor_pre_hooks(graph: fx.Graph) -> None:
    """Each tensor pre-hook runs right after the gradient it transforms is produced."""
    for node in _hooks_of(graph, "tensor_pre_hook"):
        hook_getitem, grad = _node_arg(node, 0), node.args[1]
        if isinstance(grad, fx.Node) and grad is not node.prev and not _is_unpacked_input(grad):
            grad.append(hook_getitem)
            hook_getitem.append(node)


def schedule_pre_hooks_early(graph: fx.Graph) -> None:
    """Move node pre-hooks right after their inputs, so accumulate-grad can move up past them.

    :func:`reorder_pre_hooks_like_eager` later puts each one just before its node again.
    """
    for node in _hooks_of(graph, "pre_hook"):
        hook_getitem = _node_arg(node, 0)
        producers: list[fx.Node] = []
        unpackers: list[fx.Node] = []
        for grad in _nodes_in(_sequence_arg(node, 1)):
            if grad.op == "call_function" and grad.target is operator.getitem:
                producers.append(_node_arg(grad, 0))
                unpackers.append(grad)
            else:
                producers.append(grad)
        if not producers:
            continue
        last = max(producers)
        if _is_unpacked_input(last):
            continue
        block = [*unpackers, hook_getitem, node]
        for moved in reversed(block):
            last.append(moved)


def reorder_accumulate_grad(graph: fx.Graph) -> None:
    """Each accumulate-grad runs right after the last of its inputs, as in eager."""
    for node in graph.find_nodes(op="call_function", target=call_accumulate_grad):
        inputs = list(node.args[:3])
        unpack = None
        grad = inputs[2]
        if isinstance(grad, fx.Node) and grad.target is operator.getitem:
            unpack, inputs[2] = grad, grad.args[0]
        last = max(_nodes_in(inputs))
        if last is not node.prev and not _is_unpacked_input(last):
            last.append(node)
            if unpack is not None:
                last.append(unpack)


def reorder_pre_hooks_like_eager(graph: fx.Graph) -> None:
    """Each node pre-hook runs right before the node it is registered on."""
    for node in reversed(_hooks_of(graph, "pre_hook")):
        users = list(node.users)
        if not users:
            continue
        hook_getitem = _node_arg(node, 0)
        registered = min(user for unpack in users for user in unpack.users)
        if registered is node.next:
            continue
        registered.prepend(hook_getitem)
        registered.prepend(node)
        for unpack in users:
            registered.prepend(unpack)


def reorder_post_acc_grad_hooks(graph: fx.Graph) -> None:
    """Each post-accumulate-grad hook runs right after its parameter's accumulate-grad."""
    for node in reversed(_hooks_of(graph, "post_acc_grad_hook")):
        hook_getitem, param = _node_arg(node, 0), _node_arg(node, 1)
        accumulate = next((u for u in param.users
                           if u.op == "call_function" and u.target is call_accumulate_grad),
                          None)
        if accumulate is None:
            raise RuntimeError(f"post-accumulate-grad hook {node.name} has no accumulate-grad")
        accumulate.append(hook_getitem)
        hook_getitem.append(node)


def reorder_post_hooks(graph: fx.Graph) -> None:
    """Node post-hooks whose outputs nobody consumes run right after their inputs' last use."""
    for node in reversed(_hooks_of(graph, "post_hook")):
        hook_getitem = _node_arg(node, 0)
        outputs, inputs = _sequence_arg(node, 1), _sequence_arg(node, 2)
        if len(outputs) > 0:
            continue
        candidates: list[fx.Node] = list(_nodes_in(inputs))
        for grad in _nodes_in(inputs):
            candidates.extend(u for u in grad.users
                              if not (u.target is call_hook
                                      and u.kwargs.get("hook_type") == "post_hook"))
        if not candidates:
            continue
        last = max(candidates)
        if last.op == "call_function" and last.target is call_accumulate_grad:
            after_hooks = [u for u in _node_arg(last, 0).users if u.target is call_hook
                           and u.kwargs.get("hook_type") == "post_acc_grad_hook"]
            if after_hooks:
                after_hooks[-1].append(hook_getitem)
                hook_getitem.append(node)
                continue
        if last is not node.prev and not _is_unpacked_input(last):
            last.append(hook_getitem)
            hook_getitem.append(node)


def eliminate_dead_code(graph: fx.Graph) -> int:
    """Drop unused nodes, keeping side effects and every unpack of a placeholder.

    Unpacks stay so the compiled graph still reads every input (Dynamo would otherwise need
    aliasing guards between inputs it never sees). Returns how many nodes went.
    """
    unpacks = {user for ph in graph.find_nodes(op="placeholder") for user in ph.users}

    def is_impure(node: fx.Node) -> bool:
        return (node in unpacks or (node.op == "call_function" and node.target in IMPURE_TARGETS)
                or node.is_impure())

    before = len(graph.nodes)
    graph.eliminate_dead_code(is_impure)
    removed = before - len(graph.nodes)
    logger.debug("DCE removed %d nodes", removed)
    verbose_log.debug("DCE removed %d nodes", removed)  # torch's line (logs.py)
    return removed


def remove_unused_sizes(graph: fx.Graph) -> list[int]:
    """Erase ``sizes[i]`` reads nobody uses and renumber the rest densely.

    Returns the runtime indices still used, in their new order.
    """
    sizes = next(n for n in graph.find_nodes(op="placeholder") if n.target == "sizes")
    used: list[int] = []
    for unpack in list(sizes.users):
        if unpack.target is not operator.getitem:
            raise RuntimeError(f"unexpected use of the sizes placeholder: {unpack.format_node()}")
        # sizes[i] feeds unwrap_maybe_dynamic_int; both die together when nothing reads the int
        unwrapped = list(unpack.users)
        if all(not u.users for u in unwrapped):
            for u in unwrapped:
                graph.erase_node(u)
            graph.erase_node(unpack)
            continue
        used.append(unpack.args[1])
        unpack.args = (sizes, len(used) - 1)
    return used


def move_cpu_scalars_to_cuda(graph: fx.Graph) -> list[int]:
    """Re-home CPU 0-dim inputs used only by ATen ops onto CUDA, for CUDA graphs.

    Eager backward formulas keep Python scalars as CPU 0-dim tensors (e.g. ``DivBackward0``);
    lifted as inputs they would split a CUDA graph. Only inputs that user code never sees
    (every consumer is an aten/prims op or a built-in functional backward) are moved. Returns
    the runtime input indices to move; nothing moves for a graph without CUDA inputs.
    """
    inputs = next(n for n in graph.find_nodes(op="placeholder") if n.target == "inputs")
    to_move: dict[int, fx.Node] = {}
    has_cuda = False
    for unpack in inputs.users:
        value = unpack.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        if value.device.type == "cuda":
            has_cuda = True
        elif value.device.type == "cpu" and value.dim() == 0:
            if all(_hides_scalar_from_user_code(user) for user in unpack.users):
                to_move[unpack.args[1]] = unpack
    if not has_cuda:
        return []
    # Only the runtime wrapper moves anything; the graph's metadata is stripped after capture.
    logger.debug("moving CPU scalar inputs %s to CUDA", [n.name for n in to_move.values()])
    return sorted(to_move)


def _hides_scalar_from_user_code(user: fx.Node) -> bool:
    target = user.target
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in ("aten", "prims")
    inner = getattr(target, "is_custom_function", None)
    return inner is False


def run_all(graph: fx.Graph) -> int:
    """The reorder passes then DCE, as applied at the end of every capture."""
    delay_unpack_hooks(graph)
    reorder_tensor_pre_hooks(graph)
    schedule_pre_hooks_early(graph)
    reorder_accumulate_grad(graph)
    reorder_pre_hooks_like_eager(graph)
    reorder_post_acc_grad_hooks(graph)
    reorder_post_hooks(graph)
    return eliminate_dead_code(graph)
