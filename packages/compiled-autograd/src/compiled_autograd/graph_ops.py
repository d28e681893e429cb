"""The functions a captured backward graph calls at run time.

Each is the ``target`` of ``call_function`` nodes recorded during capture, so they must be plain
module-level functions that Dynamo can inline when the graph is handed to ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._dynamo.external_utils import FakeBackwardCFunction

from compiled_autograd.interop import functional_ops


def call_backward(ctx: Any, saved_tensors: Sequence[torch.Tensor], *grads: Any) -> tuple:
    """Run a Python ``autograd.Function``'s backward with the graph's saved tensors.

    The ctx stand-in is torch's ``FakeBackwardCFunction`` on purpose: Dynamo checks for exactly
    that type when it inlines a custom Function's backward (``AutogradFunctionVariable``).
    """
    fake_ctx = FakeBackwardCFunction(ctx, list(saved_tensors))
    grads_in = fake_ctx._forward_cls.backward(fake_ctx, *grads)
    return grads_in if isinstance(grads_in, tuple) else (grads_in,)


def call_hook(hook: Any, *args: Any, hook_type: str) -> Any:
    """Run a user hook; a hook returning None leaves its first argument unchanged."""
    result = hook(*args)
    if result is None:
        return args[0]
    if hook_type == "post_acc_grad_hook":
        raise RuntimeError(
            f"post-accumulate-grad hook {hook!r} returned {type(result).__name__}; such "
            "hooks must return None")
    return result


def call_accumulate_grad(variable: torch.Tensor, variable_grad: torch.Tensor | None,
                         grad: torch.Tensor, has_post_hooks: bool,
                         read_current_grad: bool = False) -> torch.Tensor:
    """Accumulate ``grad`` into ``variable.grad`` exactly like eager AccumulateGrad.

    ``read_current_grad`` is set where the engine does not pass the current grad (torch 2.11;
    see :class:`compiled_autograd.protocol.AccumulateGradCall`).
    """
    if read_current_grad:
        variable_grad = variable.grad
    updated = functional_ops.get("AccumulateGrad")([grad], variable, variable_grad, has_post_hooks)
    variable.grad = updated[0]
    return variable.grad


def end_of_backward() -> None:
    """Marker for the end of the backward (final callbacks would run here); kept by DCE."""


def unwrap_maybe_dynamic_int(value: torch.Tensor | int) -> int:
    """Sizes arrive as ``torch.empty(0, n)`` so Dynamo can treat ``n`` as dynamic."""
    if isinstance(value, torch.Tensor):
        return value.size(1)
    return value


def copy_slices_prologue(inputs: Sequence[torch.Tensor], base_sizes: Sequence[Any],
                         base_strides: Sequence[Any], base_storage_offset: Any,
                         view_sizes: Sequence[Any], view_strides: Sequence[Any],
                         view_storage_offset: Any) -> list[torch.Tensor]:
    """First half of CopySlices (the node an in-place op on a view leaves behind)."""
    grad = inputs[0]
    if grad is None:
        raise RuntimeError("CopySlices received no gradient for its base")
    result = grad.new_empty_strided(base_sizes, base_strides)
    result.copy_(grad)
    grad_slice = result.as_strided(view_sizes, view_strides,
                                   view_storage_offset - base_storage_offset)
    return [result, grad_slice, grad_slice.clone(memory_format=torch.contiguous_format)]


def copy_slices_epilogue(needs_input_grad: Sequence[bool], result: torch.Tensor,
                         res: Sequence[torch.Tensor | None],
                         grad_slice: torch.Tensor) -> list[torch.Tensor | None]:
    """Second half of CopySlices: write the view's gradient back into the base's."""
    grad_inputs: list[torch.Tensor | None] = [None] * len(needs_input_grad)
    for index, needed in enumerate(needs_input_grad):
        grad = res[index]
        if not needed or grad is None:
            continue
        if index == 0:
            grad_slice.copy_(grad)
            grad_inputs[index] = result
        else:
            grad_inputs[index] = grad
    return grad_inputs


# Nodes calling these have side effects (hooks, .grad writes): dead-code elimination keeps them.
IMPURE_TARGETS = frozenset({call_hook, call_backward, call_accumulate_grad, end_of_backward})
