"""Pricing a graph on the CPU without generating the vectorized kernels its buffer plan ignores.

Inductor's C++ back end writes every kernel three times over: a scalar version, then (after
choosing a tiling) vectorized and 2-D tiled versions. Only the scalar kernel's bookkeeping
reaches the graph: which buffers the kernel keeps local (``removed_buffers``), which it
updates in place (``inplaced_to_remove``), and when each node allocates its outputs (its
``mark_run``); the others are generated with in-place updates off and their conclusions
dropped. The one decision the vector kernels take part in is an outer-loop fused node's
(a softmax's max, exp and sum over one row): it keeps its intermediates in a local buffer
only if every kernel's loops are split at the same levels, and the split depends on the
tiling. So while the memory model lowers a graph, the C++ kernels of ordinary nodes are
written scalar only, and outer-loop fused nodes exactly as Inductor writes them: the wrapper's
buffer lines are the same (``tests/aot_partition/test_scalar_codegen.py`` compares them on
every candidate cut of several models), at about three quarters of the lowering's time.

``AOT_PARTITION_SCALAR_PRICING=0`` lowers with every kernel written in full. A torch whose
C++ back end lacks the two hooks below is lowered in full too.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["scalar_pricing_enabled", "scalar_kernels_where_memory_allows"]


_state = threading.local()
_install_lock = threading.Lock()
_installed = False


def scalar_pricing_enabled() -> bool:
    return os.environ.get("AOT_PARTITION_SCALAR_PRICING", "1") != "0"


def _cpp_hooks() -> tuple[Any, Any] | None:
    """(CppKernelProxy, CppScheduling) where both have what this patches, else None."""
    try:
        from torch._inductor.codegen import cpp
    except Exception:  # an Inductor without a C++ back end: nothing to skip
        return None
    proxy = getattr(cpp, "CppKernelProxy", None)
    scheduling = getattr(cpp, "CppScheduling", None)
    if proxy is None or not hasattr(scheduling, "codegen_outer_loop_node"):
        return None
    return proxy, scheduling


def _install(proxy: Any, scheduling: Any) -> None:
    """Wrap the two hooks once per process. Outside a pricing lowering (another thread's
    compile included: the flags are per thread) they do exactly what Inductor's do."""
    global _installed
    with _install_lock:
        if _installed:
            return
        proxy_init = proxy.__init__
        outer_loop_node = scheduling.codegen_outer_loop_node

        @functools.wraps(proxy_init)
        def scalar_while_pricing(self: Any, *args: Any, **kwargs: Any) -> None:
            proxy_init(self, *args, **kwargs)
            if (getattr(_state, "pricing", 0) and not getattr(_state, "outer_loop", 0)
                    and hasattr(self, "picked_vec_isa")):
                self.picked_vec_isa = None  # no vector ISA: the scalar kernel only

        @functools.wraps(outer_loop_node)
        def vectorized_as_inductor_writes_it(self: Any, node: Any) -> Any:
            _state.outer_loop = getattr(_state, "outer_loop", 0) + 1
            try:
                return outer_loop_node(self, node)
            finally:
                _state.outer_loop -= 1

        proxy.__init__ = scalar_while_pricing
        scheduling.codegen_outer_loop_node = vectorized_as_inductor_writes_it
        _installed = True


@contextlib.contextmanager
def scalar_kernels_where_memory_allows() -> Iterator[None]:
    """Within this context (this thread's lowerings), C++ kernels outside outer-loop fused
    nodes are generated scalar only."""
    hooks = _cpp_hooks() if scalar_pricing_enabled() else None
    if hooks is None:
        yield
        return
    _install(*hooks)
    _state.pricing = getattr(_state, "pricing", 0) + 1
    try:
        yield
    finally:
        _state.pricing -= 1
