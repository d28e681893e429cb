"""Inductor's compiler is imported when ``torch.compile`` is called, as for ``backend="inductor"``.

A warm restart's first step is then what Inductor's is: the seconds-long import of
``torch._inductor.compile_fx`` happens at ``torch.compile``, not inside the first step.
A compiler other than Inductor does not import it at all.
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
    torch.compile(model, backend="aot_pipeline")
elif how == "compile":
    aot_pipeline.compile(model)
elif how == "compile_nop":
    aot_pipeline.compile(model, compiler="nop")
print("IMPORTED" if INDUCTOR in sys.modules else "NOT IMPORTED")
"""


def _imported_after(how: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_torch_compile_with_our_name_imports_inductor_at_the_call():
    assert _imported_after("backend") == "IMPORTED"


def test_aot_pipeline_compile_imports_inductor_at_the_call():
    assert _imported_after("compile") == "IMPORTED"


def test_other_compilers_leave_inductor_unimported():
    assert _imported_after("compile_nop") == "NOT IMPORTED"
