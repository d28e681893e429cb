"""``aot_partition.core`` needs no torch: a min-cut where importing torch raises, and the import
of the core leaves torch unloaded (the package ``__init__`` loads its fx front end lazily)."""

from __future__ import annotations

from pathlib import Path

import pytest
from no_torch import run_python

TESTS = str(Path(__file__).resolve().parent.parent)  # where core_graphs.py is


def _run(code: str, *, block_torch: bool = False):
    return run_python(code, block_torch=block_torch)


def test_the_blocker_makes_importing_torch_raise():
    # The check below cannot pass vacuously: with the blocker, torch does not import.
    done = _run("import torch\n", block_torch=True)
    assert done.returncode != 0
    assert "torch is blocked in this test" in done.stderr


def test_core_min_cut_runs_where_importing_torch_raises():
    done = _run(block_torch=True, code=f"""
sys.path.insert(0, {TESTS!r})
from aot_partition.core import partition
from core_graphs import mlp

graph = mlp()
result = partition(graph)
print(result.saved, result.cost, result.saved_bytes)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
""")
    assert done.returncode == 0, done.stderr
    # Same answer as test_core.test_mlp_recomputes_the_matmul_from_the_saved_inputs.
    assert done.stdout.splitlines() == ["('x', 'w') 70.0 0", "[]"]


def test_importing_the_core_loads_no_torch():
    done = _run("""
import sys
import aot_partition.core
import aot_partition
print("torch" in sys.modules, sorted(m for m in sys.modules if m.startswith("aot_partition")))
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1)[0] == "False", done.stdout


def test_public_names_load_on_first_read():
    # Must fire: reading a public name of the fx front end imports it (and torch).
    done = _run("""
import sys
import aot_partition
before = "torch" in sys.modules
fn = aot_partition.min_cut_rematerialization_partition
print(before, "torch" in sys.modules, fn.__module__)
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "aot_partition.partitioners"]


def test_public_names_match_all_and_the_function_classify_wins_over_its_module():
    import aot_partition.fx.classify  # noqa: F401
    with pytest.warns(DeprecationWarning, match="aot_partition.classify moved to aot_partition.fx.classify"):
        import aot_partition.classify  # noqa: F401  (the old path binds the module on the package)

    assert set(aot_partition.__all__) <= set(dir(aot_partition))
    for name in aot_partition.__all__:
        assert getattr(aot_partition, name) is not None
    assert callable(aot_partition.classify)
    assert aot_partition.classify.__module__ == "aot_partition.fx.classify"
    assert aot_partition.core.knapsack.__name__ == "aot_partition.core.knapsack"
    try:
        aot_partition.no_such_name  # noqa: B018
    except AttributeError as error:
        assert str(error) == "module 'aot_partition' has no attribute 'no_such_name'"
    else:
        raise AssertionError("an unknown name must raise AttributeError")
