"""aot_compilers: AOTAutograd back-end compilers, memory-efficient fusion and graph dumping.

Every compiler takes ``(gm: fx.GraphModule, example_inputs)`` and returns a *boxed* callable
(one list of arguments), ready for ``aot_function``/``aot_module``/``aot_module_simplified``.
The ``torch.compile`` back ends live in ``aot_compilers.backends`` (imported on demand).
"""

from __future__ import annotations

from .boxed import is_boxed, make_boxed_compiler, make_boxed_func
from .debug import DebugInterpreter, debug_nop
from .dumper import GraphDumper, debug_compile, get_inputs, graph_dumper_aot, input_meta
from .errors import (
    AotCompilersError,
    GraphDumpError,
    GraphMismatchError,
    MissingExtraError,
    TorchScriptCompileError,
    TorchScriptUnavailableError,
)
from .fusion import default_decompositions, memory_efficient_fusion
from .torchscript import nnc_jit, simple_ts_compile, strip_overloads, ts_compile
from .trivial import draw_graph_compile, nop, print_compile

__all__ = [
    "AotCompilersError",
    "DebugInterpreter",
    "GraphDumpError",
    "GraphDumper",
    "GraphMismatchError",
    "MissingExtraError",
    "TorchScriptCompileError",
    "TorchScriptUnavailableError",
    "debug_compile",
    "debug_nop",
    "default_decompositions",
    "draw_graph_compile",
    "get_inputs",
    "graph_dumper_aot",
    "input_meta",
    "is_boxed",
    "make_boxed_compiler",
    "make_boxed_func",
    "memory_efficient_fusion",
    "nnc_jit",
    "nop",
    "print_compile",
    "simple_ts_compile",
    "strip_overloads",
    "ts_compile",
]
