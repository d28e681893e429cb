"""Inductor's ``compile_fx`` is imported only where Inductor compiles.

``aot_pipeline.compile(model)`` knows its compiler at once and imports it at the call, as
``backend="inductor"`` does. ``torch.compile(backend="aot_pipeline")`` learns the compiler from
the options that come with the first graph: Inductor is imported then, and never for
``compiler="nop"`` (whose whole compile would otherwise pay about 0.7 s of CPU for nothing).
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import sys

import torch
from torch import nn

import aot_pipeline

INDUCTOR = "torch._inductor.compile_fx"
assert INDUCTOR not in sys.modules, "imported before torch.compile"
how = sys.argv[1]
model = nn.Linear(2, 2)
if how == "backend":
    compiled = torch.compile(model, backend="aot_pipeline")
elif how == "backend_nop":
    compiled = torch.compile(model, backend="aot_pipeline", options={"compiler": "nop"})
elif how == "compile":
    compiled = aot_pipeline.compile(model)
elif how == "compile_nop":
    compiled = aot_pipeline.compile(model, compiler="nop")
print("IMPORTED" if INDUCTOR in sys.modules else "NOT IMPORTED")
if "step" in sys.argv[2:]:
    compiled(torch.randn(3, 2)).sum().backward()
    print("IMPORTED" if INDUCTOR in sys.modules else "NOT IMPORTED")
"""


def _imported_after(how: str, step: bool = False) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHILD, how, *(["step"] if step else [])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-2 if step else -1:]


def test_torch_compile_with_our_name_imports_inductor_with_the_first_graph():
    assert _imported_after("backend", step=True) == ["NOT IMPORTED", "IMPORTED"]


def test_torch_compile_with_our_name_and_nop_never_imports_inductor():
    assert _imported_after("backend_nop", step=True) == ["NOT IMPORTED", "NOT IMPORTED"]


def test_aot_pipeline_compile_imports_inductor_at_the_call():
    assert _imported_after("compile") == ["IMPORTED"]


def test_other_compilers_leave_inductor_unimported():
    assert _imported_after("compile_nop", step=True) == ["NOT IMPORTED", "NOT IMPORTED"]
