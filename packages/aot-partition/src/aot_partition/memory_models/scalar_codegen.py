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

Outer-loop fused nodes are learned, not rewritten: the first node of each shape in a process
(``outer_loop_key``: its kernels' loop bodies with buffer names replaced by their roles, the
layouts they read and write, which outputs are read outside it, its grouping and fusion depth,
the vector ISA) is written vectorized as Inductor writes it, and its check's answer kept; every
later node of that shape (the next layer's softmax, the next candidate cut's) is written
scalar with Inductor's check (``check_outer_fusion_loop_level_attr``, the one call that reads
the vector kernels' loops) given the learned answer. On a transformer this halves what the
C++ kernels cost a lowering.

``AOT_PARTITION_SCALAR_PRICING=0`` lowers with every kernel written in full. A torch whose
C++ back end lacks the hooks below is lowered in full too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["clear_outer_loop_outcomes", "outer_loop_key", "scalar_pricing_enabled",
           "scalar_kernels_where_memory_allows"]

log = logging.getLogger(__name__)

_state = threading.local()
_install_lock = threading.Lock()
_installed = False
# outer_loop_key -> whether Inductor's check kept the outer-loop fusion (written vectorized).
_OUTER_LOOP_OUTCOMES: dict[tuple[Any, ...], bool] = {}
_QUOTED_NAME = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")


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
    fused = getattr(cpp, "OuterLoopFusedSchedulerNode", None)
    if proxy is None or not hasattr(scheduling, "codegen_outer_loop_node") or not hasattr(
            fused, "check_outer_fusion_loop_level_attr"):
        return None
    return proxy, scheduling


def clear_outer_loop_outcomes() -> None:
    """Forget every outer-loop node's learned answer (tests)."""
    _OUTER_LOOP_OUTCOMES.clear()


def _layout_of(name: str) -> tuple[Any, ...] | None:
    """A buffer's dtype, sizes and strides in the graph being lowered; None: not a buffer."""
    from torch._inductor.virtualized import V

    graph = V.graph
    buf = graph.name_to_buffer.get(name) or graph.graph_inputs.get(name)
    if buf is None:
        return None
    layout = buf.get_layout() if hasattr(buf, "get_layout") else getattr(buf, "layout", None)
    return (str(buf.get_dtype()), str(getattr(layout, "size", None)),
            str(getattr(layout, "stride", None)), type(layout).__name__)


def outer_loop_key(node: Any) -> tuple[Any, ...] | None:
    """What Inductor's vectorized outer-loop fusion of ``node`` depends on, free of buffer
    names: per kernel its loop body (each buffer named by its role: the i-th written inside
    the node, or the i-th read from outside, with its layout), its outputs' layouts and
    whether each is read outside the node (the local-buffer analysis), the node's grouping
    and fusion depth, and the vector ISA. None when a part cannot be read: the node is then
    written in full."""
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen.cpp import cpu_vec_isa

    try:
        inner = node.get_nodes()
        inside = set(inner)
        roles = {buf.get_name(): f"w{i}"
                 for i, buf in enumerate(b for n in inner for b in n.get_outputs())}
        outside: list[tuple[Any, ...]] = []
        kernels: list[tuple[Any, ...]] = []

        def role(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in roles:
                layout = _layout_of(name)
                if layout is None:  # a reduction's kind, an index's name: kept as written
                    return match.group(0)
                roles[name] = f"r{len(outside)}"
                outside.append(layout)
            return f"'{roles[name]}'"

        for n in inner:
            body = getattr(n, "_body", None)
            if body is None:
                return None
            text = _QUOTED_NAME.sub(role, str(body))
            outputs = n.get_outputs()
            escapes = tuple(not all(user.node in inside for user in buf.users)
                            for buf in outputs)
            kernels.append((text, escapes, tuple(_layout_of(b.get_name()) for b in outputs)))
        grouping = tuple(len(outer.get_nodes()) for outer in node.get_outer_nodes())
        return (str(cpu_vec_isa.pick_vec_isa()), inductor_config.cpp.simdlen,
                node.outer_loop_fusion_depth, grouping, tuple(kernels), tuple(outside))
    except Exception as error:  # an Inductor that reads differently: written in full
        log.debug("outer-loop node not keyed (%s: %s): written in full",
                  type(error).__name__, error)
        return None


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
        def vectorized_once_per_shape(self: Any, node: Any) -> Any:
            if not getattr(_state, "pricing", 0):
                return outer_loop_node(self, node)
            key = outer_loop_key(node)
            known = _OUTER_LOOP_OUTCOMES.get(key) if key is not None else None
            if known is not None:  # scalar, Inductor's check answered as learned
                return _with_check_answered(node, lambda *a, **k: known,
                                            lambda: outer_loop_node(self, node))
            _state.outer_loop = getattr(_state, "outer_loop", 0) + 1
            try:
                return _with_check_answered(node, _learning(node, key),
                                            lambda: outer_loop_node(self, node))
            finally:
                _state.outer_loop -= 1

        proxy.__init__ = scalar_while_pricing
        scheduling.codegen_outer_loop_node = vectorized_once_per_shape
        _installed = True


def _learning(node: Any, key: tuple[Any, ...] | None) -> Callable[..., bool]:
    """``node``'s own check (run on the vector kernels), its answer kept under ``key``."""
    check = node.check_outer_fusion_loop_level_attr

    def answered(*args: Any, **kwargs: Any) -> bool:
        answer = bool(check(*args, **kwargs))
        if key is not None:
            _OUTER_LOOP_OUTCOMES[key] = answer
        return answer

    return answered


def _with_check_answered(node: Any, check: Callable[..., bool], write: Callable[[], Any]
                         ) -> Any:
    """``write()`` with ``check`` as ``node``'s loop-level check (on this instance only)."""
    node.check_outer_fusion_loop_level_attr = check
    try:
        return write()
    finally:
        del node.check_outer_fusion_loop_level_attr


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
