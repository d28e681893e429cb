"""Each chunk of the chunked cross-entropy as one Inductor-compiled function (C++ on CPU,
Triton on GPU): the chunk's logits, its log-sum-exp, its loss and its logit gradient fused.

The chunked ops (``chunked_loss``) stay custom ops, so the compiler of the step sees each as
one call and keeps the chunks sequential (what ``auto_chunker`` gets from ``invoke_subgraph``);
inside the op, each chunk's body runs either as the op's own ATen calls ("eager": about 12
passes over each logits element) or as a function compiled here once per shape, dtype and
setting (``make_fx`` of the body, then ``torch._inductor.compile``): the projection stays a
matmul and the softmax, the one-hot, the scaling and the cast back are one or two fused loops
(about 4 passes). The matmuls that consume the gradient run outside, in place: the hidden
states' rows written by ``mm(out=)``, the weight's gradient accumulated by ``addmm_`` into the
fp32 accumulator (on CUDA a bf16 weight's product made in fp32 by ``mm(out_dtype=)`` where
torch has it; on CPU torch has no such kernel and the bf16 product is added as the eager body
does).

Which body runs: ``set_chunk_body("auto" | "compiled" | "eager")`` or the environment variable
``AOT_PARTITION_CHUNK_BODY``. "auto" (the default) compiles a chunk of at least
``AUTO_MIN_ELEMENTS`` logits on a CPU or CUDA device (below that the compile costs more than it
saves); "compiled" always (tests); "eager" never. A compile that fails is logged once as a
warning and that shape runs eagerly from then on. Before torch 2.13 the eager body always runs
(``COMPILED_BODY_TORCH``): on torch 2.11 the compiled body's forward-gradient kernels gave wrong
losses and gradients (caught by .ci/torch_range), so it is refused there, with one warning when
"compiled" is asked for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

MODES = ("auto", "compiled", "eager")
AUTO_MIN_ELEMENTS = 1 << 18  # one chunk's logits: 1 MiB in fp32
ENV = "AOT_PARTITION_CHUNK_BODY"

_cache: dict[tuple[Any, ...], Callable[..., Any] | None] = {}


def _check_mode(mode: str, where: str) -> str:
    if mode not in MODES:
        raise ValueError(f"chunk body {mode!r} ({where}): valid are {', '.join(MODES)}")
    return mode


_mode = _check_mode(os.environ.get(ENV, "auto"), f"environment variable {ENV}")


def set_chunk_body(mode: str) -> str:
    """Which body the chunked ops run ("auto", "compiled", "eager"); returns the previous."""
    global _mode
    previous, _mode = _mode, _check_mode(mode, "set_chunk_body")
    return previous


def get_chunk_body() -> str:
    return _mode


@contextmanager
def chunk_body(mode: str) -> Iterator[None]:
    """``set_chunk_body(mode)`` for a ``with`` block."""
    previous = set_chunk_body(mode)
    try:
        yield
    finally:
        set_chunk_body(previous)


def _torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


# The first torch whose compiled body is exact (2.11: wrong forward gradients; 2.13 and 2.15
# tested exact; 2.12 untested, so refused).
COMPILED_BODY_TORCH = (2, 13)
COMPILED_BODY_SUPPORTED = _torch_release() >= COMPILED_BODY_TORCH
_warned_unsupported = False


def planned(device_type: str, rows: int, vocab: int) -> bool:
    """Whether a chunk of ``rows`` tokens over ``vocab`` classes on ``device_type`` is meant to
    run the compiled body (what the memory and cost models count; a failed compile aside)."""
    global _warned_unsupported
    if _mode == "eager" or device_type not in ("cpu", "cuda"):
        return False
    if not COMPILED_BODY_SUPPORTED:
        if _mode == "compiled" and not _warned_unsupported:
            _warned_unsupported = True
            log.warning("chunk body 'compiled' refused on torch %s (it needs torch >= %d.%d: "
                        "earlier releases compile it wrong); the eager body runs",
                        torch.__version__, *COMPILED_BODY_TORCH)
        return False
    return _mode == "compiled" or rows * vocab >= AUTO_MIN_ELEMENTS


def use_compiled(hidden: Tensor, weight: Tensor, rows: int) -> bool:
    """Whether a chunk of ``rows`` tokens runs the compiled body now: as ``planned``, on real
    tensors, outside any compile (never a compile nested in another)."""
    if not planned(hidden.device.type, rows, int(weight.shape[0])):
        return False
    if torch.compiler.is_compiling() or torch._guards.TracingContext.try_get() is not None:
        return False
    return not (_is_fake(hidden) or _is_fake(weight))


def _is_fake(t: Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.device.type == "meta"


def clear_cache() -> None:
    """Forget the compiled bodies (tests)."""
    _cache.clear()


# ---- the bodies, traced by make_fx ---------------------------------------------------------
# Each takes the chunk's logits as the projection made them (its matmul runs outside, so no
# compiled graph holds a second logits-sized buffer): the bodies that make the gradient write
# it over the logits (an input mutation Inductor lowers into the input's buffer).

class _Settings:
    def __init__(self, ignore_index: int, label_smoothing: float, compute: torch.dtype
                 ) -> None:
        self.ignore_index, self.smoothing, self.compute = ignore_index, label_smoothing, compute
        self.accumulate = torch.float64 if compute is torch.float64 else torch.float32

    def nll_sum(self, logits: Tensor, lse: Tensor, kept: Tensor, safe: Tensor) -> Tensor:
        nll = lse - logits.gather(1, safe.unsqueeze(1)).squeeze(1)
        if self.smoothing:
            mean_logit = logits.sum(dim=-1) / logits.shape[1]
            nll = (1.0 - self.smoothing) * nll + self.smoothing * (lse - mean_logit)
        return torch.where(kept, nll, 0).sum(dtype=self.accumulate)

    def grad(self, logits: Tensor, lse: Tensor, kept: Tensor, safe: Tensor, scale: Tensor
             ) -> Tensor:
        """The logits' gradient in the compute dtype."""
        grad = torch.exp(logits - lse.unsqueeze(1))
        if self.smoothing:
            grad = grad - self.smoothing / logits.shape[1]
        classes = torch.arange(logits.shape[1], device=logits.device)
        hit = classes.unsqueeze(0) == safe.unsqueeze(1)
        grad = grad - torch.where(hit, 1.0 - self.smoothing, 0.0).to(self.compute)
        return grad * (kept.to(self.compute) * scale.to(self.compute)).unsqueeze(1)

    def write_grad(self, projected: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
        """The gradient over the logits (cast back: the backward of the cast to ``compute``).
        The bias's gradient is summed outside: a column sum in the same kernel makes Inductor
        keep the gradient in a second buffer."""
        projected.copy_(grad)
        return ()

    def targets(self, target: Tensor) -> tuple[Tensor, Tensor]:
        kept = target != self.ignore_index
        return kept, torch.where(kept, target, 0)


def _with_grads_body(s: _Settings) -> Callable[..., tuple[Tensor, ...]]:
    """(logits, target, scale) -> (loss sum,); the logits become their gradient."""
    def body(projected: Tensor, target: Tensor, scale: Tensor) -> tuple[Tensor, ...]:
        logits = projected.to(s.compute)
        kept, safe = s.targets(target)
        lse = torch.logsumexp(logits, dim=-1)
        nll = s.nll_sum(logits, lse, kept, safe)
        return (nll, *s.write_grad(projected, s.grad(logits, lse, kept, safe, scale)))
    return body


def _forward_body(s: _Settings) -> Callable[..., tuple[Tensor, ...]]:
    """(logits, target) -> (loss sum, log-sum-exp)."""
    def body(projected: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        logits = projected.to(s.compute)
        kept, safe = s.targets(target)
        lse = torch.logsumexp(logits, dim=-1)
        return s.nll_sum(logits, lse, kept, safe), lse
    return body


def _backward_body(s: _Settings) -> Callable[..., tuple[Tensor, ...]]:
    """(logits, target, lse, scale) -> (); the logits become their gradient."""
    def body(projected: Tensor, target: Tensor, lse: Tensor, scale: Tensor
             ) -> tuple[Tensor, ...]:
        logits = projected.to(s.compute)
        kept, safe = s.targets(target)
        return s.write_grad(projected, s.grad(logits, lse, kept, safe, scale))
    return body


_BODIES = {"with_grads": _with_grads_body, "forward": _forward_body,
           "backward": _backward_body}


def run(kind: str, logits: Tensor, extra: tuple[Tensor, ...], ignore_index: int,
        label_smoothing: float, compute: torch.dtype) -> tuple[Tensor, ...] | None:
    """The compiled body ``kind`` on one chunk's ``logits`` (``extra``: the target and the
    rest of the body's arguments), compiled on first use of its shapes; None if it cannot be
    compiled (the caller runs the eager body, on the same logits, untouched)."""
    args = (logits, *extra)
    key = (kind, ignore_index, float(label_smoothing), compute,
           *((a.shape, a.stride(), a.dtype, a.device) for a in args))
    if key not in _cache:
        _cache[key] = _compile(kind, args, _Settings(ignore_index, label_smoothing, compute))
    compiled = _cache[key]
    if compiled is None:
        return None
    with torch.no_grad():
        return tuple(compiled(*args))


def _compile(kind: str, args: tuple[Tensor, ...], settings: _Settings
             ) -> Callable[..., Any] | None:
    from torch._inductor import compile as inductor_compile
    from torch.fx.experimental.proxy_tensor import make_fx

    shapes = [tuple(a.shape) for a in args]
    try:
        with torch.no_grad():
            examples: list[Any] = [a.clone() for a in args]  # tracing writes the logits
            gm = make_fx(_BODIES[kind](settings))(*examples)
            compiled = inductor_compile(gm, examples)
    except Exception as error:  # any compile failure: the eager body, said once per shape
        log.warning("chunked cross-entropy: the %s chunk body for shapes %s did not compile "
                    "(%s: %s); that shape runs the eager body", kind, shapes,
                    type(error).__name__, error)
        return None
    log.debug("chunked cross-entropy: compiled the %s chunk body for shapes %s", kind, shapes)
    return compiled


def accumulate_weight_grad(accumulator: Tensor, grad: Tensor, hidden: Tensor) -> None:
    """``accumulator += grad.T @ hidden`` in place, the product made in the accumulator's dtype
    where the device can (fp32 accumulation of a bf16 weight's gradient)."""
    if grad.dtype == accumulator.dtype:
        accumulator.addmm_(grad.t(), hidden)
        return
    if grad.is_cuda:
        try:
            accumulator.add_(torch.mm(grad.t(), hidden, out_dtype=accumulator.dtype))
            return
        except (TypeError, RuntimeError, NotImplementedError):
            pass  # a torch without mm(out_dtype=): the product in the narrow dtype
    accumulator.add_(grad.t() @ hidden)
