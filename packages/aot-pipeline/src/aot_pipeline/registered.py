"""What ``torch.compile(backend="aot_pipeline")`` loads: the back end, nothing more.

Dynamo imports this module (our ``torch_dynamo_backends`` entry point) when ``torch.compile`` is
called with our name. The compiler (Inductor or one of aot_compilers') is only known when the
first graph arrives with its ``options``, so Inductor's ``compile_fx`` (about 0.7 s of CPU) is
imported then, by the back end, and only for ``compiler="inductor"``: ``compiler="nop"`` never
pays it. ``backend="inductor"`` imports it before tracing; ours, inside Dynamo's compile, runs
slower under Dynamo's frame-evaluation hook, so a warm compile through the name takes about
0.1 s more CPU (benchmarks/RESULTS-compile-time.md). ``aot_pipeline.compile()`` and
``aot_pipeline.make_backend()`` know their compiler at the call and import it then.
``import aot_pipeline`` stays light: only this entry point imports torch.
"""

from __future__ import annotations

from .backend import aot_pipeline_backend

__all__ = ["aot_pipeline_backend"]
