"""A CPU call's peak and end allocation, from the profiler's allocator events.

A leaf (torch only): the memory models measure steps and library scratch with it, and the
split's ops measure a chunk's oneDNN scratch on the CPU they run on.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["profiled_cpu_peak"]


def profiled_cpu_peak(step: Callable[[], Any], *, grad: bool = False) -> tuple[int, int]:
    """(peak, end): the most bytes ``step`` held allocated on the CPU at once while it ran,
    and what it left allocated (its result included), both above what was allocated before."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():
        prof.start()
    try:
        with torch.set_grad_enabled(grad):
            kept = step()
    finally:
        with _native_stderr_silenced():
            prof.stop()
    deltas = _allocation_deltas(prof)
    del kept
    total = peak = 0
    for _, delta in sorted(deltas, key=lambda d: d[0]):
        total += delta
        peak = max(peak, total)
    return peak, total


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """The process's stderr (file descriptor 2) sent to /dev/null: kineto writes "USDT: ...
    profiler_start" / "profiler_stop" there at each start and stop of the profiler (and, on a
    build with CUDA libraries but no GPU, "gpuGetDeviceCount failed"), lines nothing in the run
    can act on, which a measured CLI run would print per variant. Only around start and stop:
    the measured step's own messages still reach stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _allocation_deltas(prof: Any) -> list[tuple[int, int]]:
    """(time ns, +bytes allocated / -bytes freed) of every CPU allocator event recorded."""
    allocation = torch._C._profiler._EventType.Allocation
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    out = []
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == allocation:
            fields = event.extra_fields
            if fields.device.type == "cpu":
                out.append((event.start_time_ns, int(fields.alloc_size)))
    return out
