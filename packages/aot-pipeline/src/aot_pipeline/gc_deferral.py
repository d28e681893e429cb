"""Full garbage collections deferred while the back end compiles a graph.

A compile allocates millions of objects that reference each other (FX nodes, fake tensors,
sympy expressions, Inductor IR). With CPython's default thresholds ``(700, 10, 10)`` a full
(generation 2) collection runs every ten generation-1 collections once the objects that
survived them reach a quarter of the old heap, so a long compile rescans the whole heap
(torch, the model, everything compiled so far) again and again while it grows.

``full_collections_deferred()`` raises only the third threshold for the duration, and puts the
thresholds back when the outermost use ends. Generations 0 and 1 keep collecting, and objects
without cycles are freed by reference counting the moment they die, so what waits is cyclic
garbage old enough to reach generation 2. It is not skipped: the generation-2 count has
passed the restored threshold by then, so the next generation-1 collection after the compile
makes a full one. Several full collections become one.

Process-wide, like the thresholds themselves: nested or concurrent uses (two threads
compiling, a lazy backward compile inside a forward's) share the outermost one, and a
threshold someone else set meanwhile is left as they set it. ``gc.disable()`` is respected
(nothing is changed while the collector is off), and so is a higher threshold already set.

torch 2.15 does the same around Dynamo's own compile, under the flag
``torch._dynamo.config.gc_gen2_threshold_during_compile`` (default 1,000; None turns it off).
Where the installed torch has that flag we read our threshold from it, so a user who turned
torch's deferral off turns ours off too; on older torch we use the same default. Off on
free-threaded builds, whose collector is not generational.
"""

from __future__ import annotations

import gc
import logging
import sysconfig
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

__all__ = ["DEFERRED_GENERATION2_THRESHOLD", "TORCH_FLAG", "deferred_threshold",
           "full_collections_deferred"]

# Generation-1 collections before a full one while compiling: 1,000 (about 7 million
# allocations at the default first threshold) instead of 10, torch 2.15's default. Not
# infinite, so a compile that allocates without end still gets a full collection now and then.
DEFERRED_GENERATION2_THRESHOLD = 1000
# torch's own flag for the same deferral (torch 2.15 on), in torch._dynamo.config.
TORCH_FLAG = "gc_gen2_threshold_during_compile"


def deferred_threshold() -> int | None:
    """The generation-2 threshold to install while compiling, None for no deferral: torch's
    ``torch._dynamo.config.gc_gen2_threshold_during_compile`` where it exists (None or 0
    there: off), else ``DEFERRED_GENERATION2_THRESHOLD``; None on free-threaded builds."""
    if sysconfig.get_config_var("Py_GIL_DISABLED") == 1:
        return None
    from torch._dynamo import config

    if not hasattr(config, TORCH_FLAG):
        return DEFERRED_GENERATION2_THRESHOLD
    value = getattr(config, TORCH_FLAG)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 0):
        raise ValueError(f"torch._dynamo.config.{TORCH_FLAG} must be None or an int >= 0, "
                         f"got {value!r}")
    return value or None


_lock = threading.Lock()
_depth = 0
# (the thresholds to put back, the thresholds we set) while the outermost use changed them.
_change: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None


def _enter(threshold: int | None) -> None:
    global _depth, _change
    with _lock:
        if _depth == 0:
            first, second, third = saved = gc.get_threshold()
            if gc.isenabled() and threshold is not None and third < threshold:
                _change = saved, (first, second, threshold)
                gc.set_threshold(*_change[1])
                log.debug("full collections deferred while compiling (thresholds %s -> %s)",
                          saved, _change[1])
        _depth += 1


def _exit() -> None:
    global _depth, _change
    with _lock:
        _depth -= 1
        if _depth or _change is None:
            return
        (saved, ours), _change = _change, None
        if gc.get_threshold() == ours:
            gc.set_threshold(*saved)
        else:
            log.debug("gc thresholds were changed to %s during the compile; left as they are",
                      gc.get_threshold())


@contextmanager
def full_collections_deferred(enabled: bool = True) -> Iterator[None]:
    """Defer full collections for the duration (a no-op when ``enabled`` is False or
    ``deferred_threshold()`` is None)."""
    if not enabled:
        yield
        return
    _enter(deferred_threshold())
    try:
        yield
    finally:
        _exit()
