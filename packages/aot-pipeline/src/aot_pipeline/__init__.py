"""aot_pipeline: the full torch.compile pipeline built from the aot-* packages.

``compile``, ``make_backend``, ``aot_pipeline_backend`` and ``build_model`` are imported on
first use, so that ``import aot_pipeline`` does not import torch (the ``aot-pipeline`` command
answers ``--help`` and bad arguments at once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model_names import MODEL_NAMES
from .options import COMPILERS, SOLVERS, PipelineOptionError, PipelineOptions

if TYPE_CHECKING:
    from .api import CompiledModel, compile
    from .backend import aot_pipeline_backend, make_backend
    from .models import build_model

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
    "make_backend",
]

_LAZY = {"compile": "api", "CompiledModel": "api", "aot_pipeline_backend": "backend",
         "make_backend": "backend",
         "build_model": "models"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
