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

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

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


@torch.library.custom_op("aot_partition::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(grad_loss: Tensor, hidden: Tensor, weight: Tensor,
                                  bias: Tensor | None, target: Tensor, lse: Tensor,
                                  ignore_index: int, reduction: str, label_smoothing: float,
                                  chunks: int) -> tuple[Tensor, Tensor, Tensor]:
    """(grad hidden, grad weight, grad bias: empty without a bias), recomputing each chunk's
    logits; the weight's and the bias's gradients accumulate in fp32 (or fp64)."""
    compute = lse.dtype
    vocab = weight.shape[0]
    accumulate = torch.float64 if compute is torch.float64 else torch.float32
    scale = grad_loss.to(accumulate)
    if reduction == "mean":
        scale = scale / (target != ignore_index).sum()
    grad_hidden = torch.empty_like(hidden)
    grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device)
    grad_bias = (torch.zeros(vocab, dtype=accumulate, device=weight.device)
                 if bias is not None else weight.new_empty((0,)))
    for start, end in _chunk_bounds(hidden.shape[0], chunks):
        # One chunk-sized buffer: the logits, turned into the logits' gradient in place.
        h = hidden[start:end]
        grad = _logits(h, weight, bias, compute)
        grad.sub_(lse[start:end].unsqueeze(1)).exp_()   # the softmax
        t = target[start:end]
        kept = t != ignore_index
        if label_smoothing:
            grad.sub_(label_smoothing / vocab)
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, torch.where(kept, t, 0)] -= (1.0 - label_smoothing)
        grad.mul_((kept.to(compute) * scale.to(compute)).unsqueeze(1))
        grad = grad.to(hidden.dtype)  # the backward of the cast to ``compute``
        grad_hidden[start:end] = grad @ weight
        grad_weight += (grad.t() @ h).to(accumulate)
        if bias is not None:
            grad_bias += grad.sum(dim=0, dtype=accumulate)
        del grad
    return (grad_hidden, grad_weight.to(weight.dtype),
            grad_bias.to(bias.dtype) if bias is not None else grad_bias)


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
