"""What ``torch.compile(backend="aot_pipeline")`` loads: the back end, Inductor's compiler ready.

Dynamo imports this module (our ``torch_dynamo_backends`` entry point) when ``torch.compile`` is
called with our name. ``torch.compile(backend="inductor")`` imports Inductor's ``compile_fx``
at that moment too; doing the same here keeps that import (seconds on CPU) out of the first
compiled step, so a warm restart's first step costs what Inductor's does. ``import aot_pipeline``
stays light: only this entry point pays.
"""

from __future__ import annotations

from . import _compat
from .backend import aot_pipeline_backend

_compat.compile_fx()

__all__ = ["aot_pipeline_backend"]
