"""Turning compiled autograd on and off: ``enable``, ``disable``, ``reset`` and counters.

The C++ engine holds one compiler factory and ONE graph cache, and that cache does not remember
which compiler produced a graph (checked on 2.11/2.13/2.15: after ``enable(A)`` a later
``enable(B)`` silently re-runs A's graph). So this switch records the compiler that filled the
cache and clears it whenever a different compiler takes over, including torch's own compiled
autograd (seen through its capture counter) and on leaving a nested ``enable``.

"The same compiler" is :func:`same_compiler`: the same object, or bound methods of the same
function on the same instance. ``obj.method`` builds a new bound-method object at every attribute
access, so ``enable(self.compile_backward)`` at every training step must not count as a switch
(it did, and every step recaptured and recompiled the whole backward).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from compiled_autograd import logs, protocol
from compiled_autograd.capture import AutogradCompilerInstance
from compiled_autograd.state import STATE, CompilerFactory

logger = logging.getLogger(__name__)
verbose_logger = logging.getLogger("compiled_autograd.verbose")


class CompiledAutogradConflictError(RuntimeError):
    """torch's own compiled autograd is configured on as well; only one may own the engine."""


def counters() -> dict[str, int]:
    """``captures`` (cache misses), ``compiles`` (graphs given to a compiler_fn), ``runs``."""
    return {"captures": STATE.captures, "compiles": STATE.compiles, "runs": STATE.runs}


def is_enabled() -> bool:
    """Whether one of our compiler factories is installed in the C++ engine right now."""
    factory, _ = protocol.installed_compiler()
    return isinstance(factory, CompilerFactory)


def _torch_capture_count() -> int:
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["compiled_autograd"]["captures"])


_torch_captures_seen = 0


def _owner_of(factory: Any) -> Any:
    if factory is None:
        return None
    return factory.compiler_fn if isinstance(factory, CompilerFactory) else factory


def same_compiler(a: Any, b: Any) -> bool:
    """Whether compilers ``a`` and ``b`` fill the graph cache interchangeably.

    True for one object, and for two bound methods of one function on one instance (each
    ``obj.method`` access is a new object; Python's ``==`` on them compares exactly this).
    Anything else, including equal-looking ``functools.partial`` objects, counts as different:
    a wrong "same" would run another compiler's graph, a wrong "different" only recaptures.
    """
    if a is b:
        return True
    if isinstance(a, types.MethodType) and isinstance(b, types.MethodType):
        return a.__func__ is b.__func__ and a.__self__ is b.__self__
    return False


def _hand_cache_to(owner: Any) -> None:
    """Drop the C++ cache unless ``owner`` produced everything in it."""
    global _torch_captures_seen
    torch_captured = _torch_capture_count() != _torch_captures_seen
    if owner is None:
        return  # no compiler installed: nothing will run from the cache
    if not same_compiler(STATE.cache_owner, owner) or torch_captured:
        if not protocol.cache_is_empty():
            logger.debug("compiler changed: clearing the compiled-autograd cache")
            protocol.clear_cache()
        STATE.cache_owner = owner
    _torch_captures_seen = _torch_capture_count()


def refuse_torch_flag() -> None:
    """Raise :class:`CompiledAutogradConflictError` if torch's own flag is on."""
    config = sys.modules.get("torch._dynamo.config")
    if config is not None and getattr(config, "compiled_autograd", False):
        raise CompiledAutogradConflictError(
            "torch._dynamo.config.compiled_autograd is True, so torch.compile would install "
            "torch's own compiled autograd over this one inside compiled frames. Set "
            "torch._dynamo.config.compiled_autograd = False and use aot_config.dynamo's "
            "compiled_autograd flag (see compiled_autograd.compile) instead.")


@contextlib.contextmanager
def enable(compiler_fn: Callable[..., Any], *, dynamic: bool = True,
           move_cpu_scalars_to_cuda: bool | None = None) -> Iterator[None]:
    """Capture every backward run inside the block into one graph and run ``compiler_fn``'s
    result instead of the eager engine.

    ``compiler_fn(gm)`` (or ``compiler_fn(gm, example_inputs)``, given ``[]``) receives a
    ``torch.fx.GraphModule`` taking ``(inputs, sizes, scalars, hooks, packed_data)`` and returns
    a callable with that signature. ``dynamic=True`` captures sizes symbolically, so a new shape
    reuses the graph; with ``False`` the first capture is static and a shape change recaptures.
    Nested ``enable`` with another compiler replaces the outer one until it exits; each switch
    clears the engine's graph cache, so the outer compiler recaptures afterwards. Re-entering
    ``enable`` with the same compiler (the same object, or ``obj.method`` again: see
    :func:`same_compiler`) keeps the cache, so a training loop captures once.
    """
    protocol.current()
    if not callable(compiler_fn):
        raise TypeError(f"compiler_fn must be callable, got {type(compiler_fn).__name__}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be a bool, got {dynamic!r}")
    refuse_torch_flag()
    factory = CompilerFactory(AutogradCompilerInstance, compiler_fn)
    prior, prior_dynamic = protocol.set_compiler(factory, dynamic)
    prior_scalars = STATE.move_cpu_scalars
    STATE.move_cpu_scalars = move_cpu_scalars_to_cuda
    try:
        _hand_cache_to(compiler_fn)
    except BaseException:
        protocol.set_compiler(prior, prior_dynamic)
        raise
    # Read once, at enable, as torch does: turning a logger on inside the block changes nothing.
    verbose = _engine_verbose_logger()
    if verbose is not None:
        protocol.set_verbose_logger(verbose)
    STATE.depth += 1
    try:
        # The engine must run the backward on this thread for the capture to see it.
        with torch.autograd.set_multithreading_enabled(False):
            yield
    finally:
        STATE.depth -= 1
        STATE.move_cpu_scalars = prior_scalars
        if verbose is not None:
            protocol.set_verbose_logger(None)
        protocol.set_compiler(prior, prior_dynamic)
        _hand_cache_to(_owner_of(prior))


def _engine_verbose_logger() -> logging.Logger | None:
    """Where the C++ engine's messages go (one logger): torch's ``compiled_autograd_verbose``
    artifact logger when that artifact is on, else ours when it is on at DEBUG, else none."""
    if logs.verbose_enabled():
        return logs.verbose_log
    if verbose_logger.isEnabledFor(logging.DEBUG):
        return verbose_logger
    return None


@contextlib.contextmanager
def disable() -> Iterator[None]:
    """Run backwards inside the block with the eager engine; restores the prior compiler."""
    prior, prior_dynamic = protocol.set_compiler(None, False)
    try:
        yield
    finally:
        protocol.set_compiler(prior, prior_dynamic)


def reset() -> None:
    """Back to a fresh process: no compiler, no cached graphs, counters at zero."""
    global _torch_captures_seen
    if STATE.in_compiled_region:
        raise RuntimeError("compiled_autograd.reset() called while a compiled backward runs")
    protocol.set_compiler(None, False)
    protocol.set_verbose_logger(None)
    protocol.clear_cache()
    STATE.captures = STATE.compiles = STATE.runs = 0
    STATE.cache_owner = None
    STATE.move_cpu_scalars = None
    _torch_captures_seen = _torch_capture_count()
