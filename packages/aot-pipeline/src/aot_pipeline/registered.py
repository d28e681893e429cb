"""What ``torch.compile(backend="aot_pipeline")`` loads: the back end, and Inductor's compiler.

Dynamo imports this module (our ``torch_dynamo_backends`` entry point) when ``torch.compile`` is
called with our name, from ``lookup_backend``, before it traces anything. Inductor's
``compile_fx`` (about 0.6 s of CPU) is imported here too, as ``backend="inductor"`` imports it
at ``torch.compile``: imported later, inside Dynamo's compile, it runs under Dynamo's
frame-evaluation hook, which made a warm compile through the name 5-6% slower than Inductor's
own (benchmarks/RESULTS-compile-time.md). Inductor is the default compiler, so the name pays
the import now. Who uses the name with ``compiler="nop"`` pays it too (0.6 s once per process)
without needing it; ``aot_pipeline.make_backend(options)`` and ``aot_pipeline.compile()`` know
their compiler at the call and import Inductor only for it. ``import aot_pipeline`` stays light:
only this entry point imports torch.
"""

from __future__ import annotations

from . import _compat, transformers_logging
from .backend import aot_pipeline_backend

_compat.compile_fx()  # before Dynamo traces: see the module doc (and backend._LoadedAtLookup)
transformers_logging.ignore_loss_warning_in_dynamo()  # likewise (GPT-2's loss graph break)

__all__ = ["aot_pipeline_backend"]
