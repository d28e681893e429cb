"""Roofline runtime of one joint-graph node: max(FLOPs / peak FLOP/s, bytes moved / bandwidth).

Times are in **seconds**. Bytes moved are the bytes of the tensor arguments read plus the bytes
of the outputs written; views and metadata ops (``sym_size``, ``getitem`` ...) move nothing and
cost 0. FLOPs are counted by the caller (``estimators.count_flops``); an op without a FLOP
formula (pointwise ops, reductions) counts one FLOP per output element, so it is bandwidth-bound
on any real device.

Peak FLOP/s depend on the dtype and on whether the op runs on tensor cores: ops with a FLOP
formula in torch's FLOP counter (mm, bmm, addmm, convolution, attention ...) are "matmul-like"
and use the tensor-core rate (TF32 for float32 when ``torch.get_float32_matmul_precision()`` is
not "highest"); everything else uses the vector rate.

Device numbers come from ``DEVICE_TABLE``, chosen by the node's device: for CUDA by
``torch.cuda.get_device_name()`` (the longest table name it contains), else a conservative
default; for CPU a conservative default. ``set_device_numbers`` overrides them (for hardware not
in the table, or to estimate for a GPU while tracing on a CPU); the environment variable
``AOT_PARTITION_ROOFLINE_CUDA`` names a table entry to use for every CUDA device.

No per-op launch overhead by default: the ops the budget search recomputes are mostly pointwise
chains that Inductor fuses into kernels the backward launches anyway, so a fixed per-op cost would
make exactly the cheapest recomputations look expensive (and every tiny op weigh like a big one).
``DeviceNumbers.launch_overhead_s`` adds one for backends that run every op as its own kernel.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..fx.sizes import size_hint

log = logging.getLogger(__name__)

__all__ = [
    "CONSERVATIVE_CPU",
    "CONSERVATIVE_CUDA",
    "DEVICE_TABLE",
    "DeviceNumbers",
    "bytes_moved",
    "device_numbers",
    "is_matmul_like",
    "moves_nothing",
    "roofline_seconds",
    "set_device_numbers",
    "settings_version",
]

ENV_CUDA_DEVICE = "AOT_PARTITION_ROOFLINE_CUDA"

T = 1e12  # TFLOP/s and TB/s
G = 1e9


@dataclass(frozen=True)
class DeviceNumbers:
    """Peak rates of one device: FLOP/s (dense, no sparsity) and memory bandwidth in bytes/s."""

    name: str
    bandwidth: float           # bytes/s, main memory (HBM/GDDR/DRAM)
    fp32: float                # FLOP/s, float32 without tensor cores
    tf32: float                # FLOP/s, float32 matmul on tensor cores (TF32)
    half_matmul: float         # FLOP/s, bf16/fp16 matmul on tensor cores (fp32 accumulate)
    half_vector: float         # FLOP/s, bf16/fp16 without tensor cores
    fp64: float                # FLOP/s, float64
    bf16_matmul: float | None = None  # when bf16 tensor cores differ from fp16 (V100, T4: none)
    launch_overhead_s: float = 0.0    # added to every op that moves bytes (see module doc)

    def peak_flops(self, dtype: torch.dtype, matmul_like: bool) -> float:
        """Peak FLOP/s for an op of ``dtype``; integer and 8-bit types use the float32 rate,
        except that matmul-like 8-bit float ops use the half tensor-core rate."""
        if dtype == torch.float64:
            return self.fp64
        if dtype in (torch.float16, torch.bfloat16) or (matmul_like and dtype.itemsize == 1
                                                        and dtype.is_floating_point):
            if not matmul_like:
                return self.half_vector
            if dtype == torch.bfloat16 and self.bf16_matmul is not None:
                return self.bf16_matmul
            return self.half_matmul
        if matmul_like and dtype == torch.float32 and _tf32_enabled():
            return self.tf32
        return self.fp32


def _gpu(name: str, bandwidth_gbs: float, fp32: float, tf32: float, half_matmul: float,
         half_vector: float, fp64: float, bf16_matmul: float | None = None) -> DeviceNumbers:
    # Datasheet numbers: bandwidth in GB/s, rates in TFLOP/s, dense.
    return DeviceNumbers(name, bandwidth_gbs * G, fp32 * T, tf32 * T, half_matmul * T,
                         half_vector * T, fp64 * T,
                         None if bf16_matmul is None else bf16_matmul * T)


# Keys are matched as substrings of torch.cuda.get_device_name() (longest key first).
DEVICE_TABLE: dict[str, DeviceNumbers] = {
    d.name: d for d in (
        _gpu("H200", 4800, 67, 494.7, 989.4, 133.8, 34),
        _gpu("H100 SXM", 3350, 67, 494.7, 989.4, 133.8, 34),
        _gpu("H100 80GB HBM3", 3350, 67, 494.7, 989.4, 133.8, 34),  # the SXM part's name
        _gpu("H100 NVL", 3900, 60, 417.5, 835.5, 120, 30),
        _gpu("H100 PCIe", 2000, 51.2, 378, 756, 102.4, 25.6),
        _gpu("H100", 2000, 51.2, 378, 756, 102.4, 25.6),  # unnamed variant: the slower PCIe part
        _gpu("A100-SXM4-80GB", 2039, 19.5, 156, 312, 39, 9.7),
        _gpu("A100 80GB PCIe", 1935, 19.5, 156, 312, 39, 9.7),
        _gpu("A100-SXM4-40GB", 1555, 19.5, 156, 312, 39, 9.7),
        _gpu("A100-PCIE-40GB", 1555, 19.5, 156, 312, 39, 9.7),
        _gpu("A100", 1555, 19.5, 156, 312, 39, 9.7),
        _gpu("L40S", 864, 91.6, 183, 362, 91.6, 1.4),
        _gpu("L4", 300, 30.3, 60, 121, 30.3, 0.49),
        _gpu("A10G", 600, 31.2, 35, 70, 31.2, 0.98),
        _gpu("A10", 600, 31.2, 62.5, 125, 31.2, 0.98),
        _gpu("V100-SXM2", 900, 15.7, 15.7, 125, 31.4, 7.8, bf16_matmul=15.7),
        _gpu("V100", 900, 14, 14, 112, 28, 7, bf16_matmul=14),
        _gpu("T4", 320, 8.1, 8.1, 65, 16.2, 0.25, bf16_matmul=8.1),
        _gpu("RTX 4090", 1008, 82.6, 82.6, 165.2, 82.6, 1.3),
        _gpu("RTX 3090", 936, 35.6, 35.6, 71, 35.6, 0.56),
    )
}

# Unknown CUDA device: about a T4/L4 (slow memory, modest tensor cores), so recomputation is
# never judged cheaper than on the hardware really in use.
CONSERVATIVE_CUDA = _gpu("conservative CUDA default", 300, 8, 8, 60, 16, 0.25)
# CPU: a few cores of a server socket; bandwidth is what a few threads reach, not the socket's.
CONSERVATIVE_CPU = DeviceNumbers("conservative CPU default", bandwidth=20 * G, fp32=200 * G,
                                 tf32=200 * G, half_matmul=200 * G, half_vector=100 * G,
                                 fp64=100 * G)

# set_device_numbers overrides: a device type ("cuda", "cpu") or a device name -> numbers.
_overrides: dict[str, DeviceNumbers] = {}
_version = [0]


def settings_version() -> tuple[int, str]:
    """Changes whenever an estimate could: an override, or the float32 matmul precision.
    Estimate caches put it in their key."""
    return _version[0], torch.get_float32_matmul_precision()


def set_device_numbers(device: str, numbers: DeviceNumbers | str | None) -> None:
    """Use ``numbers`` for ``device``: a device type (``"cuda"``, ``"cpu"``, ``"xpu"`` ...) or a
    CUDA device name as ``torch.cuda.get_device_name()`` gives it. ``numbers`` may be a
    ``DEVICE_TABLE`` key (``"H100 SXM"``); None removes the override."""
    if isinstance(numbers, str):
        if numbers not in DEVICE_TABLE:
            raise ValueError(f"unknown roofline device {numbers!r}; known: "
                             f"{', '.join(sorted(DEVICE_TABLE))}")
        numbers = DEVICE_TABLE[numbers]
    if numbers is None:
        _overrides.pop(device, None)
    else:
        _overrides[device] = numbers
    _version[0] += 1
    _cuda_numbers.cache_clear()


def _tf32_enabled() -> bool:
    return torch.get_float32_matmul_precision() != "highest"


@functools.lru_cache(None)
def _cuda_device_name(index: int) -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        return torch.cuda.get_device_name(index)
    except Exception as exc:  # a broken driver must not break partitioning
        log.info("roofline: cannot read the CUDA device name: %s", exc)
        return None


def lookup(name: str) -> DeviceNumbers | None:
    """The table entry whose key is the longest substring of ``name`` (case-insensitive)."""
    lowered = name.lower()
    for key in sorted(DEVICE_TABLE, key=len, reverse=True):
        if key.lower() in lowered:
            return DEVICE_TABLE[key]
    return None


@functools.lru_cache(None)
def _cuda_numbers(index: int) -> DeviceNumbers:
    env = os.environ.get(ENV_CUDA_DEVICE)
    if env:
        found = lookup(env)
        if found is not None:
            return found
        log.warning("roofline: %s=%r names no table entry; ignoring it", ENV_CUDA_DEVICE, env)
    name = _cuda_device_name(index)
    if name is not None and name in _overrides:
        return _overrides[name]
    found = lookup(name) if name is not None else None
    if found is None:
        log.warning("roofline: CUDA device %r is not in the table; using %s (override with "
                    "aot_partition.costs.roofline.set_device_numbers)", name, CONSERVATIVE_CUDA.name)
        return CONSERVATIVE_CUDA
    log.info("roofline: CUDA device %r uses the %r numbers", name, found.name)
    return found


@functools.lru_cache(None)
def _log_fallback_once(device_type: str) -> None:
    log.warning("roofline: no numbers for device type %r; using %s (override with "
                "aot_partition.costs.roofline.set_device_numbers)", device_type, CONSERVATIVE_CPU.name)


def device_numbers(device: torch.device) -> DeviceNumbers:
    """The numbers for ``device``: an override, the table (CUDA), or a conservative default."""
    if device.type in _overrides:
        return _overrides[device.type]
    if device.type == "cuda":
        return _cuda_numbers(device.index if device.index is not None else 0)
    if device.type not in ("cpu", "meta"):
        _log_fallback_once(device.type)
    return CONSERVATIVE_CPU


# ---- bytes moved ------------------------------------------------------------------------------

# Ops that read only the rows they gather from their first argument, not the whole table.
_GATHER_PACKETS = frozenset(getattr(torch.ops.aten, name) for name in
                            ("embedding", "index_select", "gather", "index")
                            if hasattr(torch.ops.aten, name))
# Aliasing results that the schema does not mark as views.
_ALIAS_PACKETS = frozenset(getattr(torch.ops.aten, name) for name in
                           ("_unsafe_view", "alias", "lift_fresh", "detach")
                           if hasattr(torch.ops.aten, name))


def moves_nothing(node: fx.Node) -> bool:
    """A view, an aliasing op or a metadata op (anything not an aten op: ``getitem``,
    SymInt arithmetic; ``sym_size`` and its kind return no tensor)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return True
    if target.is_view or target.overloadpacket in _ALIAS_PACKETS:
        return True
    return not any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(node.meta.get("val")))


def is_matmul_like(node: fx.Node) -> bool:
    """The op has a FLOP formula in torch's FLOP counter (mm, conv, attention ...): it runs on
    tensor cores where the dtype allows."""
    from torch.utils.flop_counter import flop_registry

    return getattr(node.target, "overloadpacket", node.target) in flop_registry


def touched_bytes(val: torch.Tensor) -> int:
    """Bytes of the distinct elements of ``val``: an expanded (stride-0) dimension is read once."""
    numel = 1
    for size, stride in zip(val.shape, val.stride(), strict=True):
        size = size_hint(size)
        if size == 0:
            return 0
        if size_hint(stride) != 0:
            numel *= size
    return numel * val.dtype.itemsize


def _tensors(values: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor)]


def _input_values(node: fx.Node) -> list[torch.Tensor]:
    args = pytree.tree_leaves((node.args, node.kwargs))
    return _tensors([a.meta.get("val") for a in args if isinstance(a, fx.Node)])


def bytes_moved(node: fx.Node) -> int:
    """Bytes read (tensor arguments) plus bytes written (tensor outputs); 0 for a view or a
    metadata op. A gather (embedding, index_select ...) reads from its table only as many bytes
    as it writes."""
    if moves_nothing(node):
        return 0
    written = sum(touched_bytes(v) for v in _tensors(node.meta.get("val")))
    inputs = _input_values(node)
    if getattr(node.target, "overloadpacket", None) in _GATHER_PACKETS and inputs:
        # the table is the first argument, except embedding(weight, indices): also the first
        read = min(touched_bytes(inputs[0]), written) + sum(touched_bytes(v) for v in inputs[1:])
    else:
        read = sum(touched_bytes(v) for v in inputs)
    from ..split import chunked_loss, chunked_mlp

    if node.target in chunked_loss.CHUNKED_OPS:  # its passes over each chunk's logits
        args = pytree.tree_map_only(fx.Node, lambda a: a.meta.get("val"), node.args)
        read += chunked_loss.internal_bytes(node.target, tuple(args))
    elif node.target in chunked_mlp.CHUNKED_OPS:  # its passes over each chunk's intermediates
        args = pytree.tree_map_only(fx.Node, lambda a: a.meta.get("val"), node.args)
        read += chunked_mlp.internal_bytes(node.target, tuple(args))
    return read + written


def _node_dtype_and_device(node: fx.Node) -> tuple[torch.dtype, torch.device]:
    # The dtype that sets the rate: the widest floating input (a matmul's operands), else the
    # output's (a pointwise op computes in its result type).
    inputs = [v for v in _input_values(node) if v.dtype.is_floating_point]
    outputs = _tensors(node.meta.get("val"))
    pool = inputs if is_matmul_like(node) and inputs else outputs or inputs
    if not pool:
        return torch.float32, torch.device("cpu")
    dtype = max((v.dtype for v in pool), key=lambda d: d.itemsize)
    return dtype, pool[0].device


def _elements_written(node: fx.Node) -> int:
    return sum(math.prod(size_hint(s) for s in v.shape) for v in _tensors(node.meta.get("val")))


def roofline_seconds(node: fx.Node, flops: float | None) -> float:
    """max(FLOPs / peak FLOP/s, bytes moved / bandwidth) in seconds, plus the device's launch
    overhead; 0 for an op that moves nothing. ``flops`` (the FLOP counter's) is used for
    matmul-like ops; other ops count one operation per element written."""
    if moves_nothing(node):
        return 0.0
    nbytes = bytes_moved(node)
    dtype, device = _node_dtype_and_device(node)
    numbers = device_numbers(device)
    matmul_like = is_matmul_like(node)
    if flops is None or not matmul_like:
        flops = float(_elements_written(node))
    compute_s = flops / numbers.peak_flops(dtype, matmul_like)
    memory_s = nbytes / numbers.bandwidth
    return max(compute_s, memory_s) + numbers.launch_overhead_s
