"""aot_pipeline: the full torch.compile pipeline built from the aot-* packages.

``compile`` and ``aot_pipeline_backend`` are imported on first use, so that ``import
aot_pipeline`` (and the ``aot-pipeline`` command's ``--help``) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .models import MODEL_NAMES, build_model
from .options import COMPILERS, SOLVERS, PipelineOptionError, PipelineOptions

if TYPE_CHECKING:
    from .api import CompiledModel, compile
    from .backend import aot_pipeline_backend

__all__ = [
    "COMPILERS",
    "MODEL_NAMES",
    "SOLVERS",
    "CompiledModel",
    "PipelineOptionError",
    "PipelineOptions",
    "aot_pipeline_backend",
    "build_model",
    "compile",
]

_LAZY = {"compile": "api", "CompiledModel": "api", "aot_pipeline_backend": "backend"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
