"""The folder layout (core/ fx/ budget/ report/) and the flat layout's import paths, which keep
working until 0.3 with a DeprecationWarning naming the new home."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

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
    import aot_partition.fx.joint  # noqa: F401
    import aot_partition.report.pareto  # noqa: F401

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
