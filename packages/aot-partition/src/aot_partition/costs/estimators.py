"""Runtime estimates for joint-graph nodes, used to weigh what recomputing a node costs.

Estimators (the flag ``activation_memory_budget_runtime_estimator``):

- ``"flops"``: FLOPs counted by torch's FLOP counter on meta-device arguments of the node's
  shapes (no data is touched); ops without a FLOP formula count as 1.
- ``"roofline"``: seconds, max(FLOPs / peak FLOP/s, bytes moved / memory bandwidth) for the
  node's device (``roofline.py``): pointwise chains and reductions cost their memory traffic
  instead of nearly nothing, views cost 0.
- ``"profile"``: milliseconds measured by running the op on zero-filled arguments: Triton's
  ``do_bench`` on CUDA (CUDA events when Triton is absent), a wall-clock timer on CPU. The
  global RNG state is restored afterwards (profiling a random op must not shift the user's
  random stream); an op that fails on zero-filled arguments gets its roofline time, in ms.
- ``"testing"``: 1 for every node.

Functional collectives (collectives.py) are never run to be timed: "profile" (in ms) and
"roofline" (in s) price them as the bytes they send over ``collective_bandwidth_gbps``; their
waits cost 0. Under a rank agreement (spmd.py: many ranks), "profile" reads the times agreed by
every rank before the search; an op signature not among them gets its roofline time, never a
rank-local measurement.

Units differ between estimators (FLOPs, seconds, milliseconds); the budget search only compares
estimates of one estimator within one search, so only their ratios matter.

Estimates are cached by (estimator, op, argument signature; for "roofline" also the device
overrides and float32 matmul precision), so the repeated blocks of a deep model are estimated
once. Symbolic sizes are read through ``sizes.size_hint``, as the byte model reads them.
"""

from __future__ import annotations

import importlib
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..config import PartitionConfig, collective_bandwidth_gbps
from ..fx._compat import check_real_tensors, real_kernels
from ..fx.collectives import collective_seconds, is_collective
from ..fx.sizes import size_hint
from . import spmd
from .roofline import is_matmul_like, roofline_seconds, settings_version

log = logging.getLogger(__name__)

__all__ = [
    "RUNTIME_ESTIMATORS",
    "check_estimator",
    "clear_runtime_cache",
    "count_flops",
    "estimate_runtime",
    "roofline_runtime",
]

RUNTIME_ESTIMATORS = ("flops", "roofline", "profile", "testing")

_cache: dict[tuple[Any, ...], float] = {}


def check_estimator(name: str | None) -> str:
    """``name``, or the flag ``activation_memory_budget_runtime_estimator`` when None; an
    unknown name raises ValueError listing the valid ones."""
    if name is None:
        name = PartitionConfig.from_flags().runtime_estimator
    if name not in RUNTIME_ESTIMATORS:
        raise ValueError(f"Unknown runtime estimator {name!r}; valid: "
                         f"{', '.join(RUNTIME_ESTIMATORS)} "
                         "(flag activation_memory_budget_runtime_estimator)")
    return name


def clear_runtime_cache() -> None:
    """Forget every cached estimate (e.g. after switching devices)."""
    _cache.clear()


def _hints(sizes: Any) -> tuple[int, ...]:
    # The key is built for every node a simulated cut estimates: skip size_hint for plain ints
    # (their hint is themselves).
    values = tuple(sizes)
    for v in values:
        if type(v) is not int:
            return tuple(size_hint(v) for v in values)
    return values


# A memo of node-argument signatures: id(meta["val"]) -> (the val, its signature). The val is
# kept so its id cannot be reused while the memo lives.
SignatureMemo = dict[int, tuple[Any, Any]]


def _value_signature(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return ("T", _hints(val.shape), _hints(val.stride()), val.dtype, val.device.type)
    return ("N", type(val).__name__, size_hint(val) if isinstance(val, torch.SymInt) else None)


# Arguments whose signature is their repr, checked by exact type first (most arguments are
# nodes or these).
_REPR_TYPES = frozenset({int, float, bool, str, type(None)})


def _signature(x: Any, memo: SignatureMemo | None = None) -> Any:
    kind = type(x)
    if kind in _REPR_TYPES:
        return repr(x)
    if kind is tuple or kind is list:
        return (kind.__name__, tuple([_signature(v, memo) for v in x]))
    if isinstance(x, fx.Node):
        val = x.meta.get("val")
        if memo is None:
            return _value_signature(val)
        found = memo.get(id(val))
        if found is not None and found[0] is val:
            return found[1]
        signature = _value_signature(val)
        memo[id(val)] = (val, signature)
        return signature
    if isinstance(x, (list, tuple)):
        return (kind.__name__, tuple([_signature(v, memo) for v in x]))
    if isinstance(x, dict):
        return tuple(sorted((k, _signature(v, memo)) for k, v in x.items()))
    return repr(x)


def _materializer(device: str | None, fill: bool) -> Callable[[Any], Any]:
    def materialize(x: Any) -> Any:
        if not isinstance(x, fx.Node):
            return x
        val = x.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape = [size_hint(s) for s in val.shape]
            stride = [size_hint(s) for s in val.stride()]
            out = torch.empty_strided(shape, stride, dtype=val.dtype,
                                      device=device or val.device.type)
            return out.zero_() if fill else out
        if isinstance(val, torch.SymInt):
            return size_hint(val)
        if isinstance(val, torch.SymFloat):
            return 1.0
        if isinstance(val, torch.SymBool):
            return True
        return val
    return materialize


def count_flops(node: fx.Node) -> float:
    """FLOPs of ``node`` from torch's FLOP-counter formula for its op (shapes only).

    The formula is applied directly to meta tensors of the node's shapes, as FlopCounterMode
    would after running the op; running it is the fallback when the direct call fails.
    """
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    packet = getattr(node.target, "overloadpacket", node.target)
    formula = flop_registry.get(packet)
    if formula is None:
        return 1.0
    materialize = _materializer("meta", fill=False)
    args, kwargs = pytree.tree_map(materialize, (node.args, node.kwargs))
    out = pytree.tree_map(lambda v: materialize_value(v), node.meta.get("val"))
    try:
        return float(max(formula(*args, **kwargs, out_val=out), 1))
    except Exception:  # a formula that needs more than shapes: count by running on meta
        pass
    op = cast(Callable[..., Any], node.target)
    try:
        with FlopCounterMode(display=False) as mode:
            op(*args, **kwargs)
    except Exception as exc:  # an op without a meta kernel: its FLOPs are unknown, not zero
        log.debug("flops of %s not countable on meta tensors: %s", node.name, exc)
        return 1.0
    return float(max(mode.get_total_flops(), 1))


def materialize_value(val: Any) -> Any:
    """A meta tensor with ``val``'s (hinted) shape and strides; other values pass through."""
    if isinstance(val, torch.Tensor):
        return torch.empty_strided([size_hint(s) for s in val.shape],
                                   [size_hint(s) for s in val.stride()], dtype=val.dtype,
                                   device="meta")
    return val


def roofline_runtime(node: fx.Node) -> float:
    """The "roofline" estimate of ``node`` in seconds (FLOPs counted only for matmul-like ops:
    the others are timed by their bytes)."""
    return roofline_seconds(node, count_flops(node) if is_matmul_like(node) else None)


def _on_cuda(node: fx.Node) -> bool:
    # Read from the node's values, so an op without tensor arguments (full, arange) counts too.
    values = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in pytree.tree_leaves(values))


def _profile_ms(node: fx.Node) -> float:
    on_cuda = _on_cuda(node)
    devices = [torch.cuda.current_device()] if on_cuda else []
    # fork_rng: profiling a random op draws from the global generator, which would shift every
    # later draw of the user's program (the forward has not run yet when the partitioner does).
    with torch.random.fork_rng(devices=devices):
        try:
            return _run_and_time(node, on_cuda)
        except Exception as exc:  # e.g. an op that rejects zero-filled arguments
            log.debug("profile of %s failed (%s); using its roofline time", node.name, exc)
            return roofline_runtime(node) * 1e3


def _run_and_time(node: fx.Node, on_cuda: bool) -> float:
    op = cast(Callable[..., Any], node.target)
    with real_kernels():  # the arguments too: made under torch.compile's fake mode, fake
        args, kwargs = pytree.tree_map(_materializer(None, fill=True), (node.args, node.kwargs))
        check_real_tensors((args, kwargs), f"profiling {node.name}")

        def run() -> None:
            op(*args, **kwargs)

        if not on_cuda:
            return _wall_clock_ms(run)
        try:  # Triton is optional; importing it can fail in more ways than ImportError
            do_bench = importlib.import_module("triton.testing").do_bench
        except Exception:
            return _cuda_event_ms(run)
        # do_bench synchronizes around its CUDA-event timing and returns milliseconds.
        return float(do_bench(run))


def _wall_clock_ms(run: Callable[[], None], repeats: int = 5) -> float:
    run()  # warm-up: first calls allocate and pick kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _cuda_event_ms(run: Callable[[], None], repeats: int = 10) -> float:
    run()
    torch.cuda.synchronize()  # the warm-up and the argument fills are not timed
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def estimate_runtime(node: fx.Node, estimator: str | None = None, *,
                     signatures: SignatureMemo | None = None) -> float:
    """The estimated cost of recomputing ``node`` (FLOPs, seconds, milliseconds or 1, see the
    module doc).

    ``estimator`` defaults to the flag ``activation_memory_budget_runtime_estimator``.
    ``signatures``: a memo of argument signatures (by value) shared by calls on nodes of one
    joint and its cuts: a value read by several nodes is described once.
    """
    estimator = check_estimator(estimator)
    if estimator == "testing":
        return 1.0
    if node.op != "call_function" or not callable(node.target):
        return 1.0
    if is_collective(node) and estimator != "flops":
        seconds = collective_seconds(node, collective_bandwidth_gbps())
        return seconds * 1e3 if estimator == "profile" else seconds
    key = _estimate_key(node, estimator, signatures)
    if estimator == "profile" and spmd.profile_agreed():
        agreed = spmd.agreed_runtime(_hashable(key))
        return agreed if agreed is not None else roofline_runtime(node) * 1e3
    measure = _MEASURES[estimator]
    try:
        cached = _cache.get(key)
    except TypeError:  # an unhashable argument: estimate without caching
        return measure(node)
    if cached is None:
        cached = _cache[key] = measure(node)
    return cached


def _estimate_key(node: fx.Node, estimator: str,
                  signatures: SignatureMemo | None = None) -> tuple[Any, ...]:
    """The cache key of ``node``'s estimate: its op and argument signature (plus, for
    "roofline", the device settings); may be unhashable (an unhashable argument)."""
    key: tuple[Any, ...] = (estimator, node.target, _signature(node.args, signatures),
                            _signature(node.kwargs, signatures) if node.kwargs else ())
    if estimator == "roofline":
        key += (settings_version(),)
    return key


def _hashable(key: tuple[Any, ...]) -> tuple[Any, ...] | None:
    try:
        hash(key)
    except TypeError:
        return None
    return key


def profile_key(node: fx.Node) -> tuple[Any, ...] | None:
    """The "profile" estimate's cache key of ``node`` (what ranks agree on, spmd.py); None
    when an argument is unhashable."""
    return _hashable(_estimate_key(node, "profile"))


def measure_profile(node: fx.Node) -> float:
    """``node``'s "profile" time on this rank (cached), outside any rank agreement."""
    measure = _MEASURES["profile"]
    key = profile_key(node)
    if key is None:
        return measure(node)
    cached = _cache.get(key)
    if cached is None:
        cached = _cache[key] = measure(node)
    return cached


_MEASURES: dict[str, Callable[[fx.Node], float]] = {
    "flops": count_flops, "roofline": roofline_runtime, "profile": _profile_ms}
