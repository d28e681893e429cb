"""``memory_efficient_fusion`` and the decompositions it traces with."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._decomp import get_decompositions
from torch._functorch.aot_autograd import aot_function, aot_module

from .torchscript import ts_compile

log = logging.getLogger(__name__)

aten = torch.ops.aten

# Backward formulas and small composite ops decomposed into simpler aten ops, so the min-cut
# partitioner sees (and may recompute) pointwise pieces instead of opaque kernels.
DEFAULT_DECOMPOSITION_OPS = (
    aten.detach,
    aten.gelu_backward,
    aten.leaky_relu_backward,
    aten.sigmoid_backward,
    aten.threshold_backward,
    aten.hardtanh_backward,
    aten.hardsigmoid_backward,
    aten.hardswish_backward,
    aten.tanh_backward,
    aten.silu_backward,
    aten.elu_backward,
    aten.cudnn_batch_norm,
    aten.cudnn_batch_norm_backward,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.elu,
    aten.leaky_relu,
    aten.hardtanh,
    aten.hardswish,
    aten.hardsigmoid,
    aten.conj_physical,
    aten.is_same_size,
)

default_decompositions: dict[Any, Callable[..., Any]] = get_decompositions(
    list(DEFAULT_DECOMPOSITION_OPS))


def _allowed_overrides() -> frozenset[str]:
    params = inspect.signature(aot_function).parameters
    return frozenset(name for name, p in params.items()
                     if name != "fn" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def memory_efficient_fusion(fn: Callable[..., Any] | nn.Module, **overrides: Any
                            ) -> Callable[..., Any] | nn.Module:
    """Trace ``fn`` (a function or ``nn.Module``) ahead of time with recomputation.

    Defaults: forward and backward compiled with ``ts_compile``, the joint graph split by
    ``aot_partition.min_cut_rematerialization_partition``, and ``default_decompositions``.
    ``overrides`` replace any ``aot_function`` keyword (e.g. ``fw_compiler=nop``); an unknown
    keyword raises ``TypeError`` listing the valid ones.
    """
    from aot_partition import min_cut_rematerialization_partition

    allowed = _allowed_overrides()
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise TypeError(
            f"memory_efficient_fusion got unknown override(s) {unknown}; valid: {sorted(allowed)}")
    config: dict[str, Any] = {
        "fw_compiler": ts_compile,
        "bw_compiler": ts_compile,
        "partition_fn": min_cut_rematerialization_partition,
        "decompositions": default_decompositions,
    }
    config.update(overrides)
    if isinstance(fn, nn.Module):
        return aot_module(fn, **config)
    if not callable(fn):
        raise TypeError(
            f"memory_efficient_fusion expects a function or nn.Module, got {type(fn).__name__}")
    return aot_function(fn, **config)
