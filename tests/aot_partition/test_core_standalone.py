"""The core alone, as a foreign compiler uses it: budgets where importing torch raises, the fx
names' ImportError naming the extra, and the README's foreign front end run verbatim (also where
importing torch raises). That importing the core loads no torch: test_core_without_torch.py."""

from __future__ import annotations

import re
from pathlib import Path

from no_torch import run_python

README = (Path(__file__).resolve().parents[2] / "packages" / "aot-partition" / "README.md")
SECTION = "## The core on its own"

def _run(code: str):
    return run_python(code, block_torch=True)


def test_budgets_run_where_importing_torch_raises():
    done = _run("""
    from aot_partition.core import CoreGraph, CoreNode, partition_under_budget
    from aot_partition.errors import UnreachableMemoryBudgetError

    graph = CoreGraph.from_dicts([
        {"id": "x", "nbytes": 16, "category": "input", "forward": True},
        {"id": "a", "inputs": ["x"], "nbytes": 64, "forward": True, "runtime": 100.0},
        {"id": "b", "inputs": ["x"], "nbytes": 64, "forward": True, "runtime": 1.0},
        {"id": "out", "inputs": ["a", "b"], "nbytes": 4, "category": "reduction",
         "forward": True},
        {"id": "g", "nbytes": 4, "category": "tangent", "in_backward": True},
        {"id": "ga", "inputs": ["g", "a"], "nbytes": 64, "in_backward": True},
        {"id": "gb", "inputs": ["g", "b"], "nbytes": 64, "in_backward": True},
        {"id": "gx", "inputs": ["ga", "gb"], "nbytes": 64, "in_backward": True,
         "backward": True},
    ])
    for kwargs in ({"fraction": 0.5}, {"fraction": 0.75}, {"max_saved_bytes": 100},
                   {"max_peak_bytes": 10_000}):
        answer = partition_under_budget(graph, **kwargs)
        print(answer.saved, answer.saved_bytes, answer.peak_bytes, answer.report().budget)
    try:
        partition_under_budget(graph, max_peak_bytes=10)
    except UnreachableMemoryBudgetError as error:
        print(error.what)
    print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        # x is an input: saving it costs no memory (the one measure of saved bytes)
        "('x', 'a') 64 216 memory budget 0.5 (fraction between recompute-everything and "
        "runtime-optimal saved bytes)",
        "('x', 'a') 64 216 memory budget 0.75 (fraction between recompute-everything and "
        "runtime-optimal saved bytes)",
        "('x', 'a') 64 216 saved-bytes cap 100 bytes",
        "('a', 'b') 128 216 simulated peak cap 10000 bytes",
        "simulated memory peak cap",
        "[]",
    ]
    assert done.stderr == ""


def test_fx_names_without_torch_name_the_extra():
    done = _run("""
    import aot_partition
    for read in (lambda: aot_partition.min_cut_rematerialization_partition,
                 lambda: __import__("aot_partition.fx")):
        try:
            read()
        except ImportError as error:
            print(error)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "aot_partition.min_cut_rematerialization_partition needs torch (the torch.fx front "
        "end): pip install 'aot-partition[fx]'. The core, aot_partition.core, needs no torch.",
        "aot_partition.fx (the torch.fx front end) needs torch: pip install "
        "'aot-partition[fx]'. The core, aot_partition.core, needs no torch.",
    ]


def test_fx_modules_imported_directly_without_torch_name_the_extra():
    done = _run("""
    import importlib
    for name in ("aot_partition.budget.caps", "aot_partition.partitioners",
                 "aot_partition.report.report", "aot_partition.memory_models.simulator",
                 "aot_partition.split.chunked_loss", "aot_partition.costs.estimators"):
        try:
            importlib.import_module(name)
        except ImportError as error:
            print(error)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == 6 * [
        "this part of aot_partition (the torch.fx front end, memory_models/, split/, costs/, "
        "budget/, report/, partitioners) needs torch: pip install 'aot-partition[fx]'. The "
        "core, aot_partition.core, needs no torch."]


def test_core_names_without_torch_do_not_need_the_extra():
    # Twin: names outside the fx front end still load without torch.
    done = _run("""
    import aot_partition
    print(aot_partition.UnreachableMemoryBudgetError.__name__, aot_partition.knapsack.__name__)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["UnreachableMemoryBudgetError", "aot_partition.core.knapsack"]


def _readme_example() -> str:
    text = README.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.find("\n## ", len(SECTION))] if "\n## " in section else section
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) == 1, f"{SECTION} must hold one python block, found {len(blocks)}"
    return blocks[0]


def test_the_readme_foreign_front_end_runs_verbatim_without_torch():
    done = _run(_readme_example())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("saved-bytes cap 200000 bytes: took the recompute everything cut; "
                        "saves 0 bytes, simulated peak 1785860 bytes, recompute runtime "
                        "8.51968e+06")
    assert "  h: recomputed in backward: the budget lifted its ban (recomputing it costs " \
           "runtime 8.38861e+06)" in lines
    # the third budget kind: a peak cap (every cut here peaks the same, so the fastest is kept)
    assert lines[-1].startswith("simulated peak cap 2000000 bytes: took the runtime-optimal "
                                "cut; saves 524288 bytes, simulated peak 1785860 bytes")
    assert done.stderr == ""
