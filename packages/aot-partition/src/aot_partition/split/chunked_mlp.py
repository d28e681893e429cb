"""A token-wise MLP computed in chunks of tokens (Mini-Sequence Transformer, MsT).

``torch.ops.aot_partition.token_mlp(x, up_weight, up_bias, gate_weight, gate_bias, down_weight,
down_bias, activation, chunks)`` returns what

    down(act(up(x)))                 (plain: gate_weight None), or
    down(act(gate(x)) * up(x))       (gated: SwiGLU, GeGLU ...)

returns, each projection ``F.linear`` with or without its bias, ``act`` one of ``ACTIVATIONS``,
for x of shape [..., dim] (every leading dim a token dim), with only one chunk's [rows x hidden]
intermediates alive at a time. The forward keeps nothing but its inputs (x and the weights); the
backward recomputes each chunk's intermediates, writes that chunk's rows of x's gradient and
accumulates the weights' and biases' gradients (in fp32 for low-precision weights, fp64 for
fp64 ones).

Custom ops (``torch.library``), like chunked_loss.py's: a compiler sees each as one call it cannot
fuse into or reorder within, so under Inductor the chunks stay sequential. ``token_split.py``
rewrites a traced graph to use them. Exact up to floating-point reassociation: each chunk runs
the eager ops (and the eager backward formulas: ``silu_backward``, ``gelu_backward``,
``threshold_backward``) on its rows.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

log = logging.getLogger(__name__)

# "gelu_tanh": F.gelu(x, approximate="tanh")
ACTIVATIONS = ("relu", "silu", "gelu", "gelu_tanh")


def _chunk_bounds(tokens: int, chunks: int) -> list[tuple[int, int]]:
    size = -(-tokens // max(1, chunks)) if tokens else 1
    return [(start, min(tokens, start + size)) for start in range(0, tokens, size)]


def _check(x: Tensor, up_weight: Tensor, up_bias: Tensor | None, gate_weight: Tensor | None,
           gate_bias: Tensor | None, down_weight: Tensor, down_bias: Tensor | None,
           activation: str, chunks: int) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: valid are {', '.join(ACTIVATIONS)}")
    if isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    if x.dim() < 1 or up_weight.dim() != 2 or down_weight.dim() != 2:
        raise ValueError(
            f"token_mlp takes x [..., dim], up_weight [hidden, dim] and down_weight [out, "
            f"hidden]; got {tuple(x.shape)}, {tuple(up_weight.shape)}, "
            f"{tuple(down_weight.shape)}")
    hidden, dim = up_weight.shape
    shapes_agree = x.shape[-1] == dim and down_weight.shape[1] == hidden
    if gate_weight is not None:
        shapes_agree = shapes_agree and tuple(gate_weight.shape) == tuple(up_weight.shape)
    elif gate_bias is not None:
        raise ValueError("token_mlp: a gate bias without a gate weight")
    for bias, rows in ((up_bias, hidden), (gate_bias, hidden), (down_bias, down_weight.shape[0])):
        if bias is not None:
            shapes_agree = shapes_agree and tuple(bias.shape) == (rows,)
    if not shapes_agree:
        raise ValueError(
            f"token_mlp: shapes do not agree: x {tuple(x.shape)}, up {tuple(up_weight.shape)}, "
            f"gate {None if gate_weight is None else tuple(gate_weight.shape)}, down "
            f"{tuple(down_weight.shape)}, biases "
            f"{[None if b is None else tuple(b.shape) for b in (up_bias, gate_bias, down_bias)]}")
    dtypes = {t.dtype for t in (x, up_weight, up_bias, gate_weight, gate_bias, down_weight,
                                down_bias) if t is not None}
    if len(dtypes) != 1:
        raise ValueError(f"token_mlp: x, weights and biases must share one dtype, got "
                         f"{sorted(str(d) for d in dtypes)}")


def _act(activation: str, pre: Tensor, inplace: bool) -> Tensor:
    if activation == "relu":
        return torch.relu_(pre) if inplace else torch.relu(pre)
    if activation == "silu":
        return F.silu(pre, inplace=inplace)
    return F.gelu(pre, approximate="tanh" if activation == "gelu_tanh" else "none")


def _act_backward(activation: str, grad: Tensor, pre: Tensor | None, post: Tensor) -> Tensor:
    """Eager's backward formula of the activation (its input ``pre``, its output ``post``)."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, post, 0)
    assert pre is not None
    if activation == "silu":
        return torch.ops.aten.silu_backward(grad, pre)
    return torch.ops.aten.gelu_backward(
        grad, pre, approximate="tanh" if activation == "gelu_tanh" else "none")


def _project_into(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """``out[...] = F.linear(x, weight, bias)`` without a temporary (out: contiguous rows)."""
    if bias is None:
        torch.mm(x, weight.t(), out=out)
    else:
        torch.addmm(bias, x, weight.t(), out=out)


@torch.library.custom_op("aot_partition::token_mlp", mutates_args=())
def token_mlp(x: Tensor, up_weight: Tensor, up_bias: Tensor | None, gate_weight: Tensor | None,
              gate_bias: Tensor | None, down_weight: Tensor, down_bias: Tensor | None,
              activation: str, chunks: int) -> Tensor:
    """``down(act(up(x)))`` (no gate) or ``down(act(gate(x)) * up(x))``, ``chunks`` chunks of
    tokens at a time; x [..., dim] -> [..., out]."""
    _check(x, up_weight, up_bias, gate_weight, gate_bias, down_weight, down_bias, activation,
           chunks)
    flat = x.reshape(-1, x.shape[-1])
    out = x.new_empty((*x.shape[:-1], down_weight.shape[0]))
    rows = out.view(-1, down_weight.shape[0])
    for start, end in _chunk_bounds(flat.shape[0], chunks):
        xc = flat[start:end]
        if gate_weight is None:
            h = _act(activation, F.linear(xc, up_weight, up_bias), inplace=True)
        else:
            h = _act(activation, F.linear(xc, gate_weight, gate_bias), inplace=True)
            h.mul_(F.linear(xc, up_weight, up_bias))
        _project_into(rows[start:end], h, down_weight, down_bias)
        del h
    return out


@token_mlp.register_fake
def _(x: Tensor, up_weight: Tensor, up_bias: Tensor | None, gate_weight: Tensor | None,
      gate_bias: Tensor | None, down_weight: Tensor, down_bias: Tensor | None, activation: str,
      chunks: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], down_weight.shape[0]))


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


@torch.library.custom_op("aot_partition::token_mlp_backward", mutates_args=())
def token_mlp_backward(grad_out: Tensor, x: Tensor, up_weight: Tensor, up_bias: Tensor | None,
                       gate_weight: Tensor | None, gate_bias: Tensor | None,
                       down_weight: Tensor, down_bias: Tensor | None, activation: str,
                       chunks: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                             Tensor]:
    """(grad x, grad up weight, grad up bias, grad gate weight, grad gate bias, grad down weight,
    grad down bias), each missing one empty; each chunk's intermediates recomputed."""
    _check(x, up_weight, up_bias, gate_weight, gate_bias, down_weight, down_bias, activation,
           chunks)
    dtype = x.dtype
    accumulate = torch.float64 if dtype is torch.float64 else torch.float32
    direct = dtype is accumulate  # the matmuls accumulate straight into the gradients

    def zeros(like: Tensor | None) -> Tensor | None:
        return None if like is None else torch.zeros(like.shape, dtype=accumulate,
                                                     device=like.device)

    g_up_w = torch.zeros(up_weight.shape, dtype=accumulate, device=up_weight.device)
    g_down_w = torch.zeros(down_weight.shape, dtype=accumulate, device=down_weight.device)
    g_up_b, g_gate_w, g_gate_b = zeros(up_bias), zeros(gate_weight), zeros(gate_bias)
    g_down_b = zeros(down_bias)

    def add_weight(acc: Tensor, grad: Tensor, inp: Tensor) -> None:
        if direct:
            acc.addmm_(grad.t(), inp)
        else:
            acc += (grad.t() @ inp).to(accumulate)

    def add_bias(acc: Tensor | None, grad: Tensor) -> None:
        if acc is not None:
            acc += grad.sum(dim=0, dtype=accumulate)

    flat = x.reshape(-1, x.shape[-1])
    grads = grad_out.reshape(-1, down_weight.shape[0])
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    grad_rows = grad_x.view(-1, x.shape[-1])
    for start, end in _chunk_bounds(flat.shape[0], chunks):
        xc, go = flat[start:end], grads[start:end]
        if gate_weight is None:
            pre = F.linear(xc, up_weight, up_bias)
            post = _act(activation, pre, inplace=activation == "relu")  # relu: its output only
            add_weight(g_down_w, go, post)
            add_bias(g_down_b, go)
            grad_h = go @ down_weight
            grad_up = _act_backward(activation, grad_h, None if activation == "relu" else pre,
                                    post)
            del grad_h, pre, post
            grad_gate = None
        else:
            pre = F.linear(xc, gate_weight, gate_bias)
            up = F.linear(xc, up_weight, up_bias)
            post = _act(activation, pre, inplace=activation == "relu")
            h = post * up
            add_weight(g_down_w, go, h)
            add_bias(g_down_b, go)
            del h
            grad_h = go @ down_weight
            grad_up = grad_h * post
            grad_h.mul_(up)  # the gradient of the activation's output
            del up
            grad_gate = _act_backward(activation, grad_h, None if activation == "relu" else pre,
                                      post)
            del grad_h, pre, post
        add_weight(g_up_w, grad_up, xc)
        add_bias(g_up_b, grad_up)
        torch.mm(grad_up, up_weight, out=grad_rows[start:end])
        if grad_gate is not None:
            assert g_gate_w is not None and gate_weight is not None
            add_weight(g_gate_w, grad_gate, xc)
            add_bias(g_gate_b, grad_gate)
            grad_rows[start:end].addmm_(grad_gate, gate_weight)
        del grad_up, grad_gate

    def result(acc: Tensor | None, like: Tensor | None) -> Tensor:
        if acc is None or like is None:
            return _empty(x)
        return acc if acc.dtype == like.dtype else acc.to(like.dtype)

    return (grad_x, result(g_up_w, up_weight), result(g_up_b, up_bias),
            result(g_gate_w, gate_weight), result(g_gate_b, gate_bias),
            result(g_down_w, down_weight), result(g_down_b, down_bias))


@token_mlp_backward.register_fake
def _(grad_out: Tensor, x: Tensor, up_weight: Tensor, up_bias: Tensor | None,
      gate_weight: Tensor | None, gate_bias: Tensor | None, down_weight: Tensor,
      down_bias: Tensor | None, activation: str, chunks: int
      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    def like(t: Tensor | None) -> Tensor:
        return torch.empty_like(t) if t is not None else _empty(x)

    return (torch.empty_like(x, memory_format=torch.contiguous_format), like(up_weight),
            like(up_bias), like(gate_weight), like(gate_bias), like(down_weight),
            like(down_bias))


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor
                   ) -> None:
    x, up_w, up_b, gate_w, gate_b, down_w, down_b, activation, chunks = inputs
    ctx.save_for_backward(x, up_w, up_b, gate_w, gate_b, down_w, down_b)
    ctx.settings = (activation, chunks)  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor) -> tuple:
    x, up_w, up_b, gate_w, gate_b, down_w, down_b = ctx.saved_tensors  # type: ignore[attr-defined]
    grads = torch.ops.aot_partition.token_mlp_backward(
        grad_out, x, up_w, up_b, gate_w, gate_b, down_w, down_b,
        *ctx.settings)  # type: ignore[attr-defined]
    inputs = (x, up_w, up_b, gate_w, gate_b, down_w, down_b)
    return (*(g if t is not None else None for g, t in zip(grads, inputs)), None, None)


token_mlp.register_autograd(_backward, setup_context=_setup_context)


def reference_mlp(x: Tensor, up_weight: Tensor, up_bias: Tensor | None,
                  gate_weight: Tensor | None, gate_bias: Tensor | None, down_weight: Tensor,
                  down_bias: Tensor | None, activation: str) -> Tensor:
    """What the op computes, unchunked, in torch's own ops (for tests and benchmarks)."""
    if gate_weight is None:
        h = _act(activation, F.linear(x, up_weight, up_bias), inplace=False)
    else:
        h = (_act(activation, F.linear(x, gate_weight, gate_bias), inplace=False)
             * F.linear(x, up_weight, up_bias))
    return F.linear(h, down_weight, down_bias)


# ---- what the ops cost: FLOPs (torch's FLOP counter, hence the roofline) and memory ------------

def _sizes(x_shape: Any, up_shape: Any, down_shape: Any) -> tuple[int, int, int, int]:
    tokens = 1
    for s in list(x_shape)[:-1]:
        tokens *= int(s)
    return tokens, int(x_shape[-1]), int(up_shape[0]), int(down_shape[0])


def _matmul_flops(x_shape: Any, up_shape: Any, gated: bool, down_shape: Any) -> tuple[int, int]:
    """(one input projection, the down projection): 2 x tokens x in x out each."""
    tokens, dim, hidden, out = _sizes(x_shape, up_shape, down_shape)
    return 2 * tokens * dim * hidden, 2 * tokens * hidden * out


@register_flop_formula(torch.ops.aot_partition.token_mlp)
def _forward_flops(x_shape: Any, up_shape: Any, up_bias_shape: Any, gate_shape: Any,
                   *args: Any, **kwargs: Any) -> int:
    down_shape = args[1]
    inner, down = _matmul_flops(x_shape, up_shape, gate_shape is not None, down_shape)
    return inner * (2 if gate_shape is not None else 1) + down


@register_flop_formula(torch.ops.aot_partition.token_mlp_backward)
def _backward_flops(grad_shape: Any, x_shape: Any, up_shape: Any, up_bias_shape: Any,
                    gate_shape: Any, *args: Any, **kwargs: Any) -> int:
    down_shape = args[1]
    inner, down = _matmul_flops(x_shape, up_shape, gate_shape is not None, down_shape)
    projections = 2 if gate_shape is not None else 1
    # the input projections again, then two matmuls for each projection's gradients
    return projections * inner + 2 * (projections * inner + down)


CHUNKED_OPS = (torch.ops.aot_partition.token_mlp.default,
               torch.ops.aot_partition.token_mlp_backward.default)


def _unpack(target: Any, args: tuple[Any, ...]) -> tuple[Any, Any, Any, Any, Any, int]:
    """(x, up weight, gate weight, down weight, down bias, chunks) of either op's arguments."""
    if target is torch.ops.aot_partition.token_mlp_backward.default:
        args = args[1:]
    x, up_w, _up_b, gate_w, _gate_b, down_w, down_b, _activation, chunks = args[:9]
    return x, up_w, gate_w, down_w, down_b, int(chunks)


def workspace_bytes(target: Any, args: tuple[Any, ...]) -> int:
    """What one call allocates and frees inside (its outputs excluded), from the argument
    shapes: one chunk's [rows, hidden] intermediates at their most alive at once (forward:
    one, plain, its activation in place, two with GELU's out-of-place one or gated; backward:
    the activation's input and output, the up projection's output and the gradients of the
    intermediate: three plain with ReLU, four with another activation or gated with ReLU, five
    gated), and in the backward of low-precision weights the fp32 accumulators with one
    chunk's product before its cast. Exact for fp32 on CPU; a library's scratch (oneDNN's for
    bf16 matmuls) is not included. ``args``: the op's arguments (tensors or anything with
    ``shape`` and ``dtype``)."""
    x, up_w, gate_w, down_w, down_b, chunks = _unpack(target, args)
    activation = args[-2] if target is torch.ops.aot_partition.token_mlp_backward.default \
        else args[7]
    tokens, dim, hidden, out = _sizes(x.shape, up_w.shape, down_w.shape)
    rows = -(-tokens // max(1, chunks)) if tokens else 0
    item = x.dtype.itemsize
    gated = gate_w is not None
    in_place = activation in ("relu", "silu")
    if target is torch.ops.aot_partition.token_mlp.default:
        return (2 if gated or not in_place else 1) * rows * hidden * item
    alive = (4 if gated else 3) + (0 if activation == "relu" else 1)
    scratch = alive * rows * hidden * item
    if x.dtype not in (torch.float32, torch.float64):
        weights = (2 if gated else 1) * hidden * dim + out * hidden
        scratch += weights * 4 + (out * 4 if down_b is not None else 0)  # fp32 accumulators
        scratch += max(hidden * dim, out * hidden) * (item + 4)  # a chunk's product, its cast
    return scratch


# Passes over each intermediate element (read or written) inside one call, beyond its inputs and
# outputs: forward: each input projection written, the activation (and the product) read and
# written, the down projection's read; backward: all of that recomputed, plus the intermediate's
# gradient written and read by each weight-gradient and input-gradient matmul.
_PASSES = {("forward", False): 4, ("forward", True): 7,
           ("backward", False): 10, ("backward", True): 17}


def internal_bytes(target: Any, args: tuple[Any, ...]) -> int:
    """Memory traffic inside one call, beyond reading its inputs and writing its outputs."""
    x, up_w, gate_w, down_w, _down_b, _chunks = _unpack(target, args)
    tokens, _dim, hidden, _out = _sizes(x.shape, up_w.shape, down_w.shape)
    kind = ("forward" if target is torch.ops.aot_partition.token_mlp.default else "backward")
    return tokens * hidden * _PASSES[(kind, gate_w is not None)] * x.dtype.itemsize
