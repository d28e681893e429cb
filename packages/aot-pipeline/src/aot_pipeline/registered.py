"""What ``torch.compile(backend="aot_pipeline")`` loads: the back end, nothing more.

Dynamo imports this module (our ``torch_dynamo_backends`` entry point) when ``torch.compile`` is
called with our name. The compiler (Inductor or one of aot_compilers') is only known when the
first graph arrives with its ``options``, so Inductor's ``compile_fx`` (about 0.7 s of CPU) is
imported then, by the back end, and only for ``compiler="inductor"``: ``compiler="nop"`` never
pays it. ``backend="inductor"`` imports it before tracing; a warm compile of ours takes
0.07-0.1 s more CPU, about half of which goes away when it is imported before tracing too
(benchmarks/RESULTS-compile-time.md);
``aot_pipeline.compile()`` knows its compiler at the call and imports it then.
``import aot_pipeline`` stays light: only this entry point imports torch.
"""

from __future__ import annotations

from .backend import aot_pipeline_backend

__all__ = ["aot_pipeline_backend"]
