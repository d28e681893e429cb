"""The folder layout (core/ fx/ split/ costs/ memory_models/ budget/ report/) and the old import
paths (the flat layout's, and the modules that left fx/ for their rooms), which keep working
until 0.3 with a DeprecationWarning naming the new home."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from aot_partition._moved import MOVED_MODULES


def test_every_old_module_path_warns_and_is_the_new_module():
    script = textwrap.dedent("""
        import importlib, json, sys, warnings
        from aot_partition._moved import MOVED_MODULES
        out = {}
        for old, new in MOVED_MODULES.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module("aot_partition." + old)
            out[old] = [module.__name__, [str(w.message) for w in caught
                                          if w.category is DeprecationWarning]]
        import aot_partition
        out["classify is the function"] = [callable(aot_partition.classify), []]
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    for old, new in MOVED_MODULES.items():
        name, messages = seen[old]
        assert name == f"aot_partition.{new}"
        assert (f"aot_partition.{old} moved to aot_partition.{new}; the old import path goes "
                f"away in aot-partition 0.3") in messages
    assert seen["classify is the function"] == [True, []]


def test_new_paths_do_not_warn(recwarn):
    import aot_partition.budget.caps  # noqa: F401
    import aot_partition.costs.estimators  # noqa: F401
    import aot_partition.fx.joint  # noqa: F401
    import aot_partition.memory_models.inductor  # noqa: F401
    import aot_partition.report.pareto  # noqa: F401
    import aot_partition.split.token_split  # noqa: F401

    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)
                and "aot_partition" in str(w.message)]


def test_old_budget_names_warn_and_resolve():
    import aot_partition.budget
    import pytest
    from aot_partition.budget.search import BudgetSearch

    with pytest.warns(DeprecationWarning, match=r"aot_partition\.budget\.BudgetSearch moved to "
                                                r"aot_partition\.budget\.search\.BudgetSearch"):
        assert aot_partition.budget.BudgetSearch is BudgetSearch
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        aot_partition.budget.nope  # noqa: B018


@pytest.mark.parametrize(("name", "home"), [
    ("CutMeasure", "budget.peak"), ("BYTE_BUDGET_FRACTIONS", "budget.candidates"),
    ("extract_cut", "fx.cut"), ("step_estimate", "costs.cut_runtime")])
def test_names_that_left_budget_caps_warn_and_resolve(name, home):
    import importlib

    import aot_partition.budget.caps as caps

    with pytest.warns(DeprecationWarning, match=(
            rf"aot_partition\.budget\.caps\.{name} moved to aot_partition\.{home}\.{name}; "
            r"the old path goes away in aot-partition 0\.3")):
        found = getattr(caps, name)
    assert found is getattr(importlib.import_module(f"aot_partition.{home}"), name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        caps.nope  # noqa: B018


def test_a_moved_module_is_one_module_patching_one_patches_both():
    import warnings

    import aot_partition.memory_models.simulator as simulator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import aot_partition.fx.memory as old  # noqa: F401
    assert old is simulator


def test_the_rooms_hold_their_modules():
    """fx/ is the joint's front end: the memory models, the split and the cost estimators live
    in rooms of their own, and the front end stays small enough to read."""
    from pathlib import Path

    import aot_partition

    package = Path(aot_partition.__file__).parent
    fx_modules = {p.stem for p in (package / "fx").rglob("*.py")}
    assert not fx_modules & {"memory", "inductor_memory", "caching_allocator", "memory_models",
                             "symbolic_peak", "token_split", "chunked_loss", "chunked_mlp",
                             "estimators", "roofline", "spmd"}
    for room, modules in {"memory_models": {"simulator", "inductor", "caching_allocator",
                                            "pricing", "symbolic_peak", "shape_guards"},
                          "split": {"token_split", "chunked_loss", "chunked_mlp"},
                          "costs": {"estimators", "roofline", "spmd", "cut_runtime"}}.items():
        assert modules <= {p.stem for p in (package / room).glob("*.py")}, room
    fx_lines = sum(len(p.read_text().splitlines()) for p in (package / "fx").rglob("*.py"))
    assert fx_lines <= 5000, f"fx/ has {fx_lines} lines: move what is not the front end out"
