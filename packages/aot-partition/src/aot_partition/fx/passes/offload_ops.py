"""The four operators an offloaded activation puts into the graphs (namespace ``aot_partition``).

Forward::

    host = aot_partition.offload_to_host(x)          # side stream: x -> pinned host, event
    host = aot_partition.wait_offload(host, x)       # compute stream waits; x's last use

Backward::

    dev = aot_partition.prefetch_to_device(host, device)  # side stream: host -> device, event
    dev = aot_partition.wait_prefetch(dev, host)          # compute stream waits: before 1st use

On CUDA the copies run on one transfer stream per device, into pinned host memory (pageable
with ``pinned=False``: the flag ``activation_offload_device="cpu_pageable"``), with
``non_blocking=True``; each copy records an event, kept in a registry under its result's data
pointer, that the matching wait makes the compute stream wait on. The transfer stream first
waits for the compute stream, so the source is written and a freshly allocated destination is
no longer read by earlier kernels. The waits take the copy's source as a second argument: it
stays alive until the copy is done, and the free (fx code generation's ``x = None``, an
Inductor buffer's last use) comes right after. No ``record_stream``: the allocator would keep
the block until the side stream's next sync.

Without CUDA (CPU tests) the copies are clones into a separate CPU buffer and the waits do
nothing, so the graphs keep the same structure. All four have fake-tensor rules, run under any
dispatch mode, and compile under Inductor (the waits return an alias of their first argument,
like ``_c10d_functional.wait_tensor``; both are marked side-effecting so no pass drops them).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch
from torch.fx.node import has_side_effect

log = logging.getLogger(__name__)

__all__ = ["OFFLOAD_META", "OFFLOAD_OPS", "offload_to_host", "prefetch_to_device", "wait_offload",
           "wait_prefetch"]

# node.meta key on every node the offload rewrite adds (fx/offload.py): {"role": ..., "value":
# the offloaded value's name, and for the copies "nbytes", "seconds", "hidden_seconds"}.
OFFLOAD_META = "aot_partition_offload"

_lib = torch.library.Library("aot_partition", "FRAGMENT")  # noqa: TOR901 (our namespace)
_lib.define("offload_to_host(Tensor value, bool pinned=True) -> Tensor")
_lib.define("wait_offload(Tensor(a) host, Tensor source) -> Tensor(a)")
_lib.define("prefetch_to_device(Tensor host, Device device) -> Tensor")
_lib.define("wait_prefetch(Tensor(a) value, Tensor host) -> Tensor(a)")

_transfer_streams: dict[torch.device, Any] = {}
# data pointer of a copy's result -> the event its copy recorded (CUDA only)
_pending: dict[int, Any] = {}
_lock = threading.Lock()


def _transfer_stream(device: torch.device) -> Any:
    with _lock:
        if device not in _transfer_streams:
            _transfer_streams[device] = torch.cuda.Stream(device=device)
        return _transfer_streams[device]


def _copy_on_side_stream(destination: torch.Tensor, source: torch.Tensor,
                         device: torch.device) -> torch.Tensor:
    """``destination.copy_(source)`` on ``device``'s transfer stream; records its event."""
    compute = torch.cuda.current_stream(device)
    side = _transfer_stream(device)
    side.wait_stream(compute)
    event = torch.cuda.Event()
    with torch.cuda.stream(side):
        destination.copy_(source, non_blocking=True)
        event.record(side)
    with _lock:
        _pending[destination.data_ptr()] = event
    return destination


def _wait(value: torch.Tensor, device: torch.device, what: str) -> None:
    with _lock:
        event = _pending.pop(value.data_ptr(), None)
    if event is None:
        raise RuntimeError(f"aot_partition.{what}: no copy in flight for this tensor; every wait "
                           "must follow its own offload_to_host/prefetch_to_device")
    torch.cuda.current_stream(device).wait_event(event)


def _offload_to_host(value: torch.Tensor, pinned: bool = True) -> torch.Tensor:
    # Copies keep the value's strides (the mechanism takes dense, non-overlapping values).
    if value.device.type != "cuda":
        return value.clone()
    host = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu",
                               pin_memory=pinned)
    return _copy_on_side_stream(host, value, value.device)


def _wait_offload(host: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    if source.device.type == "cuda":
        _wait(host, source.device, "wait_offload")
    return host


def _prefetch_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device, copy=True)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    # Allocated on the compute stream (its allocator pool); the side stream waits for it.
    value = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
    return _copy_on_side_stream(value, host, device)


def _wait_prefetch(value: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    if value.device.type == "cuda":
        _wait(value, value.device, "wait_prefetch")
    return value


for _name, _impl in (("offload_to_host", _offload_to_host), ("wait_offload", _wait_offload),
                     ("prefetch_to_device", _prefetch_to_device),
                     ("wait_prefetch", _wait_prefetch)):
    # One implementation for every device: the arguments mix host and device tensors.
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")


@torch.library.register_fake("aot_partition::offload_to_host", lib=_lib)
def _offload_to_host_fake(value: torch.Tensor, pinned: bool = True) -> torch.Tensor:
    return value.new_empty_strided(value.shape, value.stride(), device="cpu")


@torch.library.register_fake("aot_partition::wait_offload", lib=_lib)
def _wait_offload_fake(host: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return host


@torch.library.register_fake("aot_partition::prefetch_to_device", lib=_lib)
def _prefetch_to_device_fake(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return host.new_empty_strided(host.shape, host.stride(), device=device)


@torch.library.register_fake("aot_partition::wait_prefetch", lib=_lib)
def _wait_prefetch_fake(value: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    return value


offload_to_host = torch.ops.aot_partition.offload_to_host.default
wait_offload = torch.ops.aot_partition.wait_offload.default
prefetch_to_device = torch.ops.aot_partition.prefetch_to_device.default
wait_prefetch = torch.ops.aot_partition.wait_prefetch.default
OFFLOAD_OPS = frozenset({offload_to_host, wait_offload, prefetch_to_device, wait_prefetch})

for _op in (wait_offload, wait_prefetch):
    has_side_effect(_op)
