"""The GraphModules a partition returns, with their Python code generated on first use.

A plain ``fx.GraphModule`` generates and compiles its Python code when it is built: about
0.1 s per 2,500 nodes, 40% of a direct partition call on a 32-block GPT joint, and wasted on
every compiler that reads only the graph (Inductor, or a compiler that imports aot_partition
for the graphs). Inside torch.compile torch builds ``_LazyGraphModule``s instead, whose
``forward`` is a stub that generates the code when called; ``torch.jit.script`` compiles that
stub's ``*args`` signature and fails (torch 2.15 rebuilds a plain module before scripting).

``CodeOnFirstUseGraphModule`` is a ``_LazyGraphModule`` (torch's hooks for lazy modules, such
as ``force_recompile`` before compiled autograd traces a backward, work on it) whose pending
``forward`` is a descriptor: reading ``module.forward`` in any way (a call,
``torch.jit.script``, ``inspect``, symbolic tracing) generates the code first and gives the
real method; ``code``, ``str()``, pickling and deep copies work as on a lazy module.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import (
    _get_graph_module_cls,
    _LazyGraphModule,
    _make_graph_module,
)

__all__ = ["CodeOnFirstUseGraphModule", "has_generated_code", "make_graph_module"]


class _GeneratedOnAccess:
    """The class attribute ``forward`` of a module whose code is not generated yet."""

    def __get__(self, module: fx.GraphModule | None, owner: type | None = None) -> Any:
        if module is None:
            return self
        # Writes the real forward onto the module's own class (every GraphModule has one).
        _LazyGraphModule.force_recompile(module)
        return type(module).forward.__get__(module, owner)


_PENDING = _GeneratedOnAccess()


class CodeOnFirstUseGraphModule(_LazyGraphModule):
    """A lazy GraphModule that ``torch.jit.script`` and ``inspect`` can read (see module doc).

    ``recompile()`` marks the code as out of date, as on torch's lazy modules; the next read
    of ``forward`` or ``code`` generates it.
    """

    forward = _PENDING
    # torch.jit.script compiles a module's properties; this one generates code (Python only).
    __jit_unused_properties__ = [*fx.GraphModule.__jit_unused_properties__, "code"]

    @classmethod
    def recompile(cls) -> None:  # type: ignore[override]
        cls.forward = _PENDING

    @classmethod
    def _needs_recompile(cls) -> bool:
        # torch's own passes may also install the lazy stub (split_module does).
        forward = cls.forward
        return forward is _PENDING or forward is cls._lazy_forward


def has_generated_code(module: fx.GraphModule) -> bool:
    """Whether ``module``'s Python code is generated and up to date with its last recompile."""
    return not (isinstance(module, _LazyGraphModule) and module._needs_recompile())


def make_graph_module(root: torch.nn.Module, graph: fx.Graph, *,
                      code_on_first_use: bool) -> fx.GraphModule:
    """A partition's forward or backward module.

    Inside torch.compile (its ``use_lazy_graph_module`` setting on) the ``_LazyGraphModule``
    torch builds there; elsewhere a ``CodeOnFirstUseGraphModule`` when ``code_on_first_use``
    (the flag ``lazy_partition_modules``), else the plain GraphModule torch's partitioner
    returns on a direct call.
    """
    if code_on_first_use and _get_graph_module_cls() is not _LazyGraphModule:
        return CodeOnFirstUseGraphModule(root, graph)
    return _make_graph_module(root, graph)
