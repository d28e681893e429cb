"""A final projection and its token-wise cross-entropy, computed in chunks of tokens.

``torch.ops.aot_partition.linear_cross_entropy(hidden, weight, bias, target, ...)`` returns
what ``F.cross_entropy(F.linear(hidden, weight, bias).to(dtype), target, ...)`` returns, with
only one chunk's logits, probabilities and logit gradient alive at a time: the forward keeps
each token's log-sum-exp (4 bytes a token in fp32), the backward recomputes each chunk's logits
from it and accumulates the weight's gradient chunk by chunk in fp32.

The two ops are custom ops (``torch.library``), so a compiler sees each as one call it cannot
fuse into or reorder within: under Inductor the chunks stay sequential, which a rewrite into
plain ops does not achieve (Inductor's fusion puts hand-chunked logits back together).
``token_split.py`` rewrites a traced graph to use them. Exact up to floating-point
reassociation: ``ignore_index`` tokens contribute nothing, ``mean`` divides by the number of
tokens not ignored (nan when there are none, as torch's), ``label_smoothing`` as torch's.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from . import chunk_body

log = logging.getLogger(__name__)

REDUCTIONS = ("mean", "sum")
_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64,
                                   "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """The name the ops take for a compute dtype ("float32")."""
    for name, known in _DTYPES.items():
        if known is dtype:
            return name
    raise ValueError(f"no chunked cross-entropy in {dtype}; valid: {', '.join(_DTYPES)}")


def _chunk_bounds(tokens: int, chunks: int) -> list[tuple[int, int]]:
    size = -(-tokens // max(1, chunks)) if tokens else 1
    return [(start, min(tokens, start + size)) for start in range(0, tokens, size)]


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    return F.linear(hidden, weight, bias).to(dtype)


def _compiled_chunk(kind: str, hidden: Tensor, weight: Tensor, bias: Tensor | None,
                    start: int, end: int, extra: tuple[Tensor, ...], ignore_index: int,
                    label_smoothing: float, compute: torch.dtype
                    ) -> tuple[Tensor, tuple[Tensor, ...]] | None:
    """One chunk through its compiled body (chunk_body): (the projection's output, the
    body's outputs); a body that makes the gradient writes it over the projection's output.
    None where the eager body runs."""
    if not chunk_body.use_compiled(hidden, weight, end - start):
        return None
    projected = F.linear(hidden[start:end], weight, bias)
    out = chunk_body.run(kind, projected, extra, ignore_index, label_smoothing, compute)
    return None if out is None else (projected, out)


def _check(hidden: Tensor, weight: Tensor, target: Tensor, reduction: str, chunks: int) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or target.dim() != 1:
        raise ValueError(
            f"linear_cross_entropy takes hidden [tokens, dim], weight [vocab, dim] and target "
            f"[tokens]; got {tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(target.shape)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r}: valid are {', '.join(REDUCTIONS)}")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")


@torch.library.custom_op("aot_partition::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                         ignore_index: int, reduction: str, label_smoothing: float,
                         dtype: str, chunks: int) -> tuple[Tensor, Tensor]:
    """(loss, per-token log-sum-exp in ``dtype``) of the logits ``linear(hidden)`` cast to
    ``dtype``, ``chunks`` chunks of tokens at a time."""
    _check(hidden, weight, target, reduction, chunks)
    compute = _DTYPES[dtype]
    vocab = weight.shape[0]
    lse = torch.empty(hidden.shape[0], dtype=compute, device=hidden.device)
    total = torch.zeros((), dtype=torch.float64 if compute is torch.float64 else torch.float32,
                        device=hidden.device)
    for start, end in _chunk_bounds(hidden.shape[0], chunks):
        compiled = _compiled_chunk("forward", hidden, weight, bias, start, end,
                                   (target[start:end],), ignore_index, label_smoothing, compute)
        if compiled is not None:
            total += compiled[1][0]
            lse[start:end] = compiled[1][1]
            del compiled  # this chunk's logits, before the next chunk's
            continue
        # One chunk-sized buffer: the logits, turned into their exponentials in place.
        logits = _logits(hidden[start:end], weight, bias, compute)
        t = target[start:end]
        kept = t != ignore_index
        picked = logits.gather(1, torch.where(kept, t, 0).unsqueeze(1)).squeeze(1)
        mean_logit = logits.sum(dim=-1) / vocab if label_smoothing else None
        top = logits.amax(dim=-1)
        chunk_lse = logits.sub_(top.unsqueeze(1)).exp_().sum(dim=-1).log_().add_(top)
        del logits
        lse[start:end] = chunk_lse
        nll = chunk_lse - picked
        if mean_logit is not None:
            nll = (1.0 - label_smoothing) * nll + label_smoothing * (chunk_lse - mean_logit)
        total += torch.where(kept, nll, 0).sum(dtype=total.dtype)
    if reduction == "mean":
        total = total / (target != ignore_index).sum()
    return total.to(compute), lse


@linear_cross_entropy.register_fake
def _(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, ignore_index: int,
      reduction: str, label_smoothing: float, dtype: str, chunks: int) -> tuple[Tensor, Tensor]:
    compute = _DTYPES[dtype]
    return (hidden.new_empty((), dtype=compute),
            hidden.new_empty((hidden.shape[0],), dtype=compute))


class _GradAccumulator:
    """The projection's gradients, chunk by chunk, from each chunk's softmax (in place):
    the hidden states' rows written, the weight's and the bias's accumulated in fp32 (fp64)."""

    def __init__(self, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                 ignore_index: int, reduction: str, label_smoothing: float,
                 compute: torch.dtype) -> None:
        self.hidden, self.weight, self.bias, self.target = hidden, weight, bias, target
        self.ignore_index, self.smoothing, self.compute = ignore_index, label_smoothing, compute
        self.accumulate = torch.float64 if compute is torch.float64 else torch.float32
        self.scale = torch.ones((), dtype=self.accumulate, device=hidden.device)
        if reduction == "mean":
            self.scale = self.scale / (target != ignore_index).sum()
        self.grad_hidden = torch.empty_like(hidden)
        self.grad_weight = torch.zeros(weight.shape, dtype=self.accumulate, device=weight.device)
        self.grad_bias = (torch.zeros(weight.shape[0], dtype=self.accumulate,
                                      device=weight.device)
                          if bias is not None else weight.new_empty((0,)))

    def add(self, start: int, end: int, softmax: Tensor, grad_loss: Tensor | None = None) -> None:
        grad = softmax
        t = self.target[start:end]
        kept = t != self.ignore_index
        if self.smoothing:
            grad.sub_(self.smoothing / grad.shape[1])
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, torch.where(kept, t, 0)] -= (1.0 - self.smoothing)
        scale = self.chunk_scale(grad_loss)
        grad.mul_((kept.to(self.compute) * scale.to(self.compute)).unsqueeze(1))
        grad = grad.to(self.hidden.dtype)  # the backward of the cast to ``compute``
        self.add_grad(start, end, grad)

    def chunk_scale(self, grad_loss: Tensor | None) -> Tensor:
        return self.scale if grad_loss is None else self.scale * grad_loss.to(self.accumulate)

    def add_grad(self, start: int, end: int, grad: Tensor, bias_grad: Tensor | None = None
                 ) -> None:
        """The matmuls of one chunk's logit gradient ``grad`` (in the projection's dtype):
        its hidden rows written, the weight's (and the bias's) gradient accumulated."""
        h = self.hidden[start:end]
        rows = self.grad_hidden[start:end]
        if rows.is_contiguous():
            torch.mm(grad, self.weight, out=rows)
        else:
            rows.copy_(grad @ self.weight)
        chunk_body.accumulate_weight_grad(self.grad_weight, grad, h)
        if self.bias is not None:
            self.grad_bias += (bias_grad if bias_grad is not None
                               else grad.sum(dim=0, dtype=self.accumulate))

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        return (self.grad_hidden, self.grad_weight.to(self.weight.dtype),
                self.grad_bias.to(self.bias.dtype) if self.bias is not None else self.grad_bias)


@torch.library.custom_op("aot_partition::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(grad_loss: Tensor, hidden: Tensor, weight: Tensor,
                                  bias: Tensor | None, target: Tensor, lse: Tensor,
                                  ignore_index: int, reduction: str, label_smoothing: float,
                                  chunks: int) -> tuple[Tensor, Tensor, Tensor]:
    """(grad hidden, grad weight, grad bias: empty without a bias), recomputing each chunk's
    logits; the weight's and the bias's gradients accumulate in fp32 (or fp64)."""
    grads = _GradAccumulator(hidden, weight, bias, target, ignore_index, reduction,
                             label_smoothing, lse.dtype)
    for start, end in _chunk_bounds(hidden.shape[0], chunks):
        compiled = _compiled_chunk(
            "backward", hidden, weight, bias, start, end,
            (target[start:end], lse[start:end], grads.chunk_scale(grad_loss)), ignore_index,
            label_smoothing, lse.dtype)
        if compiled is not None:
            grads.add_grad(start, end, compiled[0], *compiled[1])
            del compiled  # this chunk's logits, before the next chunk's
            continue
        # One chunk-sized buffer: the logits, turned into the logits' gradient in place.
        softmax = _logits(hidden[start:end], weight, bias, lse.dtype)
        softmax.sub_(lse[start:end].unsqueeze(1)).exp_()
        grads.add(start, end, softmax, grad_loss)
        del softmax
    return grads.result()


@linear_cross_entropy_backward.register_fake
def _(grad_loss: Tensor, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
      lse: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
      chunks: int) -> tuple[Tensor, Tensor, Tensor]:
    return (torch.empty_like(hidden), torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else weight.new_empty((0,)))


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple
                   ) -> None:
    hidden, weight, bias, target, ignore_index, reduction, smoothing, _dtype, chunks = inputs
    ctx.save_for_backward(hidden, weight, bias, target, output[1])
    ctx.settings = (ignore_index, reduction, smoothing, chunks)  # type: ignore[attr-defined]
    ctx.has_bias = bias is not None  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad_loss: Tensor, _grad_lse: Tensor
              ) -> tuple:
    hidden, weight, bias, target, lse = ctx.saved_tensors  # type: ignore[attr-defined]
    grad_hidden, grad_weight, grad_bias = torch.ops.aot_partition.linear_cross_entropy_backward(
        grad_loss, hidden, weight, bias, target, lse, *ctx.settings)  # type: ignore[attr-defined]
    return (grad_hidden, grad_weight, grad_bias if ctx.has_bias else None,  # type: ignore[attr-defined]
            None, None, None, None, None, None)


linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("aot_partition::linear_cross_entropy_with_grads", mutates_args=())
def linear_cross_entropy_with_grads(hidden: Tensor, weight: Tensor, bias: Tensor | None,
                                    target: Tensor, ignore_index: int, reduction: str,
                                    label_smoothing: float, dtype: str, chunks: int
                                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, and its gradients for hidden, weight and bias: empty without a bias) in one pass
    over the chunks: each chunk's logits become its gradient while they exist, so the backward
    only scales the kept gradients by the loss's gradient (no logits recomputed: the
    projection's three matmuls, as unsplit, for two [tokens, dim] and [vocab, dim] tensors
    kept from forward to backward)."""
    _check(hidden, weight, target, reduction, chunks)
    compute = _DTYPES[dtype]
    vocab = weight.shape[0]
    grads = _GradAccumulator(hidden, weight, bias, target, ignore_index, reduction,
                             label_smoothing, compute)
    total = torch.zeros((), dtype=grads.accumulate, device=hidden.device)
    for start, end in _chunk_bounds(hidden.shape[0], chunks):
        compiled = _compiled_chunk("with_grads", hidden, weight, bias, start, end,
                                   (target[start:end], grads.scale), ignore_index,
                                   label_smoothing, compute)
        if compiled is not None:
            total += compiled[1][0]
            grads.add_grad(start, end, compiled[0], *compiled[1][1:])
            del compiled  # this chunk's logits, before the next chunk's
            continue
        logits = _logits(hidden[start:end], weight, bias, compute)
        t = target[start:end]
        kept = t != ignore_index
        picked = logits.gather(1, torch.where(kept, t, 0).unsqueeze(1)).squeeze(1)
        mean_logit = logits.sum(dim=-1) / vocab if label_smoothing else None
        top = logits.amax(dim=-1)
        sums = logits.sub_(top.unsqueeze(1)).exp_().sum(dim=-1)
        chunk_lse = sums.log() + top
        nll = chunk_lse - picked
        if mean_logit is not None:
            nll = (1.0 - label_smoothing) * nll + label_smoothing * (chunk_lse - mean_logit)
        total += torch.where(kept, nll, 0).sum(dtype=total.dtype)
        grads.add(start, end, logits.div_(sums.unsqueeze(1)))
        del logits
    if reduction == "mean":
        total = total / (target != ignore_index).sum()
    return (total.to(compute), *grads.result())


@linear_cross_entropy_with_grads.register_fake
def _(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, ignore_index: int,
      reduction: str, label_smoothing: float, dtype: str, chunks: int
      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (hidden.new_empty((), dtype=_DTYPES[dtype]), torch.empty_like(hidden),
            torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else weight.new_empty((0,)))


def _setup_with_grads(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple
                      ) -> None:
    ctx.save_for_backward(*output[1:])
    ctx.has_bias = inputs[2] is not None  # type: ignore[attr-defined]


def _backward_with_grads(ctx: torch.autograd.function.FunctionCtx, grad_loss: Tensor,
                         *_unused: Tensor) -> tuple:
    grad_hidden, grad_weight, grad_bias = ctx.saved_tensors  # type: ignore[attr-defined]
    return (grad_hidden * grad_loss.to(grad_hidden.dtype),
            grad_weight * grad_loss.to(grad_weight.dtype),
            grad_bias * grad_loss.to(grad_bias.dtype) if ctx.has_bias else None,  # type: ignore[attr-defined]
            None, None, None, None, None, None)


linear_cross_entropy_with_grads.register_autograd(_backward_with_grads,
                                                  setup_context=_setup_with_grads)


def reference_linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None,
                                   target: Tensor, ignore_index: int = -100,
                                   reduction: str = "mean", label_smoothing: float = 0.0,
                                   dtype: torch.dtype | None = None) -> Tensor:
    """What the op computes, unchunked, in torch's own ops (for tests and benchmarks)."""
    logits = F.linear(hidden, weight, bias)
    if dtype is not None:
        logits = logits.to(dtype)
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


# ---- what the ops cost: FLOPs (torch's FLOP counter, hence the roofline) and memory ------------

def _projection_flops(hidden_shape: Any, weight_shape: Any) -> int:
    """One [tokens, dim] x [dim, vocab] matmul."""
    return 2 * int(hidden_shape[0]) * int(hidden_shape[1]) * int(weight_shape[0])


@register_flop_formula(torch.ops.aot_partition.linear_cross_entropy)
def _forward_flops(hidden_shape: Any, weight_shape: Any, *args: Any, **kwargs: Any) -> int:
    return _projection_flops(hidden_shape, weight_shape)


@register_flop_formula(torch.ops.aot_partition.linear_cross_entropy_backward)
def _backward_flops(grad_shape: Any, hidden_shape: Any, weight_shape: Any, *args: Any,
                    **kwargs: Any) -> int:
    return 3 * _projection_flops(hidden_shape, weight_shape)  # logits again, then both grads


@register_flop_formula(torch.ops.aot_partition.linear_cross_entropy_with_grads)
def _with_grads_flops(hidden_shape: Any, weight_shape: Any, *args: Any, **kwargs: Any) -> int:
    return 3 * _projection_flops(hidden_shape, weight_shape)


CHUNKED_OPS = (torch.ops.aot_partition.linear_cross_entropy.default,
               torch.ops.aot_partition.linear_cross_entropy_backward.default,
               torch.ops.aot_partition.linear_cross_entropy_with_grads.default)


def _op_shapes(target: Any, args: tuple[Any, ...]) -> tuple[Any, Any, Any, torch.dtype, int]:
    """(hidden, weight, bias, compute dtype, chunks) of a call of one of the ops."""
    if target is torch.ops.aot_partition.linear_cross_entropy_backward.default:
        return args[1], args[2], args[3], args[5].dtype, args[9]
    return args[0], args[1], args[2], _DTYPES[args[7]], args[8]


def _chunk_rows(tokens: int, chunks: Any) -> int:
    return -(-tokens // max(1, int(chunks))) if tokens else 0


def compiled_body_planned(target: Any, args: tuple[Any, ...]) -> bool:
    """Whether a call's chunks run their compiled body (chunk_body.planned)."""
    hidden, weight, _bias, _compute, chunks = _op_shapes(target, args)
    device = getattr(hidden, "device", None)
    return chunk_body.planned(device.type if device is not None else "cpu",
                              _chunk_rows(int(hidden.shape[0]), chunks), int(weight.shape[0]))


@functools.lru_cache(maxsize=64)
def _projection_scratch(rows: int, dim: int, vocab: int, dtype: torch.dtype) -> int | None:
    """What oneDNN allocates inside one chunk's low-precision projection on this CPU (it
    depends on the instruction set: AMX tiles need far less than AVX-512), measured once per
    shape on a product of at most 4,096 x 4,096 outputs (the scratch follows the inner
    dimension, not the outer two); None where it cannot run."""
    from ..fx._compat import real_kernels
    from ..fx.profiled_peak import profiled_cpu_peak

    try:  # real tensors even inside a compile; a generator of its own: the user's is not moved
        with real_kernels(), torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            hidden = torch.randn(min(rows, 4096), dim, generator=generator).to(dtype)
            weight = torch.randn(min(vocab, 4096), dim, generator=generator).to(dtype)
            F.linear(hidden, weight)  # oneDNN's first call sets up its kernels
            peak, _ = profiled_cpu_peak(lambda: F.linear(hidden, weight))
    except Exception:  # noqa: BLE001 - an estimate then, not a failure
        return None
    output = hidden.shape[0] * weight.shape[0] * hidden.element_size()
    return max(0, peak - output)


def workspace_bytes(target: Any, args: tuple[Any, ...]) -> int:
    """What one call allocates and frees inside (its outputs excluded), from the argument
    shapes (measured on CPU, torch 2.13): one chunk's logits (the eager body: in the compute
    dtype, the projection's output before the cast and the gradient cast back; the compiled
    body: the projection's output alone, the gradient written over it), the per-token
    vectors and the fp32 accumulators. ``args`` are the op's arguments (tensors or anything
    with ``shape`` and ``dtype``)."""
    hidden, weight, bias, compute, chunks = _op_shapes(target, args)
    tokens, dim = (int(s) for s in hidden.shape)
    vocab = int(weight.shape[0])
    rows = _chunk_rows(tokens, chunks)
    chunk = rows * vocab
    low = hidden.dtype.itemsize
    mixed = hidden.dtype != compute
    grads = target is not torch.ops.aot_partition.linear_cross_entropy.default
    if compiled_body_planned(target, args):
        logits = chunk * low
        # with gradients, the transposed gradient's copy for a bf16 weight-gradient product;
        # without, oneDNN's scratch for a bf16 projection (the chunk's vectors come after it)
        if mixed and grads:
            logits += chunk * low
        elif mixed:
            device = getattr(hidden, "device", None)
            scratch = (_projection_scratch(rows, dim, vocab, hidden.dtype)
                       if device is not None and device.type == "cpu" else None)
            if scratch is not None:
                return logits + max(scratch, 8 * rows * 8)
            logits += rows * 512 + dim * 256  # measured on an AVX-512 CPU without AMX
    else:
        logits = chunk * compute.itemsize + (chunk * low if mixed else 0)
        logits += chunk * low if mixed and grads else 0  # the gradient cast back
    vectors = 8 * rows * 8  # lse, picked, top, sums, masks, indices of one chunk
    accumulators = 0
    if grads:  # fp32 accumulators a narrower weight's gradient is cast from at the end
        accumulators = vocab * dim * 4 if mixed else 0
        if bias is not None:  # the bias's column sum; the weight product then at the peak
            accumulators += vocab * 4 + (vocab * dim * low if mixed else 0)
    return logits + vectors + accumulators


# Passes over each logits element, read or written, in the wider of the two dtypes (the cast,
# max, exp, sum, normalise, one-hot, scale, cast back, the matmuls' reads): the roofline adds
# them to the op's inputs and outputs (a loss Inductor fuses makes about 3).
_PASSES_PER_ELEMENT = {"forward": 7, "backward": 9, "with_grads": 12}
# The compiled body (chunk_body): the projection's write, one fused pass (reads; with
# gradients also the write over the logits), the two matmuls' reads, the bias's column sum.
_COMPILED_PASSES_PER_ELEMENT = {"forward": 2, "backward": 5, "with_grads": 5}


def internal_bytes(target: Any, args: tuple[Any, ...]) -> int:
    """Memory traffic inside one call, beyond reading its inputs and writing its outputs: the
    passes over each chunk's logits, and the weight-sized traffic each chunk repeats (what
    makes more chunks cost more: the weight read by every chunk's matmuls and, with
    gradients, every chunk's weight-gradient product added into the fp32 accumulator)."""
    if target is torch.ops.aot_partition.linear_cross_entropy_backward.default:
        hidden, weight, compute, kind, chunks = args[1], args[2], args[5].dtype, "backward", args[9]
    else:
        hidden, weight, chunks = args[0], args[1], args[8]
        compute = _DTYPES[args[7]]
        kind = ("forward" if target is torch.ops.aot_partition.linear_cross_entropy.default
                else "with_grads")
    elements = int(hidden.shape[0]) * int(weight.shape[0])
    if compiled_body_planned(target, args):  # the logits stay in the projection's dtype
        logits = elements * _COMPILED_PASSES_PER_ELEMENT[kind] * hidden.dtype.itemsize
    else:
        logits = (elements * _PASSES_PER_ELEMENT[kind]
                  * max(compute.itemsize, hidden.dtype.itemsize))
    return logits + max(1, int(chunks)) * _weight_bytes_per_chunk(weight, compute, kind)


def _weight_bytes_per_chunk(weight: Any, compute: torch.dtype, kind: str) -> int:
    """Weight-sized bytes one chunk moves: the logits matmul reads the weight; with gradients
    the grad-hidden matmul reads it again (the backward's recompute a third time), the
    weight-gradient product is written (and read back and written in fp32 when the weight is
    narrower), and adding it reads the fp32 accumulator and the product and writes the sum."""
    size, itemsize = int(weight.numel()), weight.dtype.itemsize
    if kind == "forward":
        return size * itemsize
    reads = 3 if kind == "backward" else 2
    cast = itemsize + 4 if itemsize < 4 else 0
    return size * (reads * itemsize + itemsize + cast + 3 * 4)
