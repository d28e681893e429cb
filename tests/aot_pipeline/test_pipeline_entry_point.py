"""Where Inductor's ``compile_fx`` is imported.

``aot_pipeline.compile(model)`` and ``aot_pipeline.make_backend(options)`` know their compiler
at once and import it at the call, and only for Inductor. ``torch.compile(backend="aot_pipeline")``
imports it at ``torch.compile(...)``, when Dynamo looks the name up, before it traces: as
``backend="inductor"`` does, so a warm compile through the name is not slower than Inductor's
(issue 40). The name cannot see its options there, so ``compiler="nop"`` through the name pays the
import too (about 0.6 s of CPU once per process): ``make_backend`` is the way around it.

``import aot_pipeline.backend`` names the back end in Dynamo's registry, so torch's lookup does
not import every ``torch._dynamo.backends`` module and scan the entry points first (0.2 s).
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
elif how == "make_backend":
    compiled = torch.compile(model, backend=aot_pipeline.make_backend())
elif how == "make_backend_nop":
    compiled = torch.compile(model, backend=aot_pipeline.make_backend({"compiler": "nop"}))
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


def test_torch_compile_with_our_name_imports_inductor_at_the_call():
    assert _imported_after("backend", step=True) == ["IMPORTED", "IMPORTED"]


def test_the_name_with_nop_pays_the_import_too():
    # The cost of the parity above, stated: the name learns its options only with a graph.
    assert _imported_after("backend_nop", step=True) == ["IMPORTED", "IMPORTED"]


def test_aot_pipeline_compile_imports_inductor_at_the_call():
    assert _imported_after("compile") == ["IMPORTED"]


def test_make_backend_imports_inductor_at_the_call():
    # Before torch.compile, as backend="inductor" does; compiled with our partitioner.
    assert _imported_after("make_backend", step=True) == ["IMPORTED", "IMPORTED"]


def test_make_backend_with_nop_never_imports_inductor():
    assert _imported_after("make_backend_nop", step=True) == ["NOT IMPORTED", "NOT IMPORTED"]


def test_other_compilers_leave_inductor_unimported():
    assert _imported_after("compile_nop", step=True) == ["NOT IMPORTED", "NOT IMPORTED"]


REGISTRY_CHILD = r"""
import sys

import torch
import torch._dynamo
from torch._dynamo.backends import registry

if sys.argv[1] == "taken":  # a user's own back end under our name, registered first
    def mine(gm, example_inputs):
        return gm.forward
    registry.register_backend(compiler_fn=mine, name="aot_pipeline")
if sys.argv[1] != "entry_point_only":
    import aot_pipeline.backend as backend
found = registry.lookup_backend("aot_pipeline")
print(registry._lazy_import.cache_info().currsize,
      found.__name__, found is sys.modules.get("aot_pipeline.backend", object).__dict__.get(
          "aot_pipeline_backend"))
model = torch.nn.Linear(2, 2)
x = torch.randn(3, 2)
options = {"compiler": "nop"} if sys.argv[1] != "taken" else None  # theirs takes none
out = torch.compile(model, backend="aot_pipeline", options=options)(x)
assert torch.equal(out, model(x))
"""


def _lookup(how: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", REGISTRY_CHILD, how],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1].split()


def test_importing_the_backend_names_it_in_dynamos_registry():
    # torch's lookup then skips importing every torch._dynamo.backends module and the
    # entry-point scan (0 = _lazy_import never ran), and finds the same function.
    assert _lookup("imported") == ["0", "aot_pipeline_backend", "True"]


def test_the_entry_point_alone_still_finds_it():
    # Not imported first: torch's lookup scans as before (1 = _lazy_import ran) and loads us.
    assert _lookup("entry_point_only") == ["1", "aot_pipeline_backend", "True"]


def test_a_users_backend_under_our_name_is_not_replaced():
    assert _lookup("taken") == ["0", "mine", "False"]
