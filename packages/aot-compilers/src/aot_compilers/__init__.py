"""aot_compilers: AOTAutograd back-end compilers, memory-efficient fusion and graph dumping.

Every compiler takes ``(gm: fx.GraphModule, example_inputs)`` and returns a *boxed* callable
(one list of arguments), ready for ``aot_function``/``aot_module``/``aot_module_simplified``.
The ``torch.compile`` back ends live in ``aot_compilers.backends``.

Names are imported on first use (PEP 562), so a reproduction script that only needs
``get_inputs`` does not pay for importing AOTAutograd, sympy and TorchScript.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "is_boxed": "boxed",
    "make_boxed_compiler": "boxed",
    "make_boxed_func": "boxed",
    "DebugInterpreter": "debug",
    "debug_nop": "debug",
    "DumpGroup": "dumper",
    "GraphDumper": "dumper",
    "debug_compile": "dumper",
    "get_inputs": "dumper",
    "graph_dumper_aot": "dumper",
    "input_meta": "dumper",
    "read_dump": "dumper",
    "DumpManifest": "dump_store",
    "read_manifest": "dump_store",
    "load_input_meta": "input_files",
    "AotCompilersError": "errors",
    "GraphDumpError": "errors",
    "GraphMismatchError": "errors",
    "MissingExtraError": "errors",
    "TorchScriptCompileError": "errors",
    "TorchScriptUnavailableError": "errors",
    "UntrustedInputError": "errors",
    "default_decompositions": "fusion",
    "memory_efficient_fusion": "fusion",
    "nnc_jit": "torchscript",
    "simple_ts_compile": "torchscript",
    "strip_overloads": "torchscript",
    "ts_compile": "torchscript",
    "draw_graph_compile": "trivial",
    "nop": "trivial",
    "print_compile": "trivial",
}

__all__ = [
    "AotCompilersError",
    "DebugInterpreter",
    "DumpGroup",
    "DumpManifest",
    "GraphDumpError",
    "GraphDumper",
    "GraphMismatchError",
    "MissingExtraError",
    "TorchScriptCompileError",
    "TorchScriptUnavailableError",
    "UntrustedInputError",
    "debug_compile",
    "debug_nop",
    "default_decompositions",
    "draw_graph_compile",
    "get_inputs",
    "graph_dumper_aot",
    "input_meta",
    "is_boxed",
    "load_input_meta",
    "make_boxed_compiler",
    "make_boxed_func",
    "memory_efficient_fusion",
    "nnc_jit",
    "nop",
    "print_compile",
    "read_dump",
    "read_manifest",
    "simple_ts_compile",
    "strip_overloads",
    "ts_compile",
]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'aot_compilers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from .boxed import is_boxed, make_boxed_compiler, make_boxed_func
    from .debug import DebugInterpreter, debug_nop
    from .dump_store import DumpManifest, read_manifest
    from .dumper import (
        DumpGroup,
        GraphDumper,
        debug_compile,
        get_inputs,
        graph_dumper_aot,
        input_meta,
        read_dump,
    )
    from .errors import (
        AotCompilersError,
        GraphDumpError,
        GraphMismatchError,
        MissingExtraError,
        TorchScriptCompileError,
        TorchScriptUnavailableError,
        UntrustedInputError,
    )
    from .fusion import default_decompositions, memory_efficient_fusion
    from .input_files import load_input_meta
    from .torchscript import nnc_jit, simple_ts_compile, strip_overloads, ts_compile
    from .trivial import draw_graph_compile, nop, print_compile
