"""The core on its own (issue 28, item 2): budgets on plain-data graphs, and the core's import.

Graphs: a deep MLP training step written as CoreNodes (per layer: a parameter, a matmul, a
normalization, an activation; the backward mirrors it), 8, 64 and 256 layers (67, 515 and 2051
nodes). Each timing is one ``partition_under_budget`` call on a freshly built graph (building is
not timed; the graph caches its search, so a fresh graph carries nothing over), median of
``--repeats``; "sweep" is 33 fractions (i/32) on one fresh graph, its candidate cuts built by
the first call and shared by the rest, as a Pareto sweep would. The import is ``import aot_partition.core`` in a fresh interpreter, numpy's own import
timed first in the same process, median of 5. Scipy's own first import is excluded by a warm-up
call before the clock.

    uv run python benchmarks/core_budget_bench.py --results
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from aot_partition.core import CoreGraph, CoreNode, partition_under_budget

HERE = Path(__file__).resolve().parent


def deep_mlp(layers: int, batch: int = 512, width: int = 256) -> CoreGraph:
    act = 4 * batch * width
    nodes = [CoreNode("x", nbytes=act, category="input", forward=True)]
    prev = "x"
    for i in range(layers):
        nodes += [
            CoreNode(f"w{i}", nbytes=4 * width * width, category="parameter", forward=True),
            CoreNode(f"h{i}", (prev, f"w{i}"), nbytes=act, category="compute", forward=True,
                     runtime=64.0 * batch * width),
            CoreNode(f"n{i}", (f"h{i}",), nbytes=act, category="reduction", forward=True,
                     runtime=2.0 * batch * width),
            CoreNode(f"a{i}", (f"n{i}",), nbytes=act, category="pointwise", forward=True,
                     runtime=1.0 * batch * width),
        ]
        prev = f"a{i}"
    nodes += [CoreNode("loss", (prev,), nbytes=4, category="reduction", forward=True),
              CoreNode("ct", nbytes=4, category="tangent", in_backward=True)]
    grad = "ct"
    for i in reversed(range(layers)):
        below = f"a{i - 1}" if i else "x"
        nodes += [
            CoreNode(f"ga{i}", (grad, f"a{i}", f"n{i}"), nbytes=act, category="pointwise",
                     in_backward=True),
            CoreNode(f"gn{i}", (f"ga{i}", f"h{i}"), nbytes=act, category="reduction",
                     in_backward=True),
            CoreNode(f"gw{i}", (below, f"gn{i}"), nbytes=4 * width * width, category="compute",
                     in_backward=True, backward=True),
            CoreNode(f"gi{i}", (f"gn{i}", f"w{i}"), nbytes=act, category="compute",
                     in_backward=True),
        ]
        grad = f"gi{i}"
    return CoreGraph(tuple(nodes))


def one_call(layers: int, repeats: int, **budget: float) -> float:
    times = []
    for _ in range(repeats):
        graph = deep_mlp(layers)
        start = time.perf_counter()
        partition_under_budget(graph, **budget)  # type: ignore[arg-type]
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def import_times(runs: int = 5) -> tuple[float, float]:
    code = ("import time; t = time.perf_counter(); import numpy; n = time.perf_counter() - t; "
            "t = time.perf_counter(); import aot_partition.core; c = time.perf_counter() - t; "
            "import sys; assert 'torch' not in sys.modules; print(n, c)")
    found = [tuple(map(float, subprocess.run([sys.executable, "-c", code], check=True,
                                             capture_output=True, text=True).stdout.split()))
             for _ in range(runs)]
    return (statistics.median(n for n, _ in found) * 1e3,
            statistics.median(c for _, c in found) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", action="store_true",
                        help="write benchmarks/RESULTS-core-budget.md")
    args = parser.parse_args()
    partition_under_budget(deep_mlp(2), fraction=0.5)  # scipy's first import, not timed
    rows = []
    for layers in (8, 64, 256):
        graph = deep_mlp(layers)
        start = time.perf_counter()
        answers = [partition_under_budget(graph, fraction=i / 32) for i in range(33)]
        sweep = (time.perf_counter() - start) * 1e3
        saved = [a.saved_bytes for a in answers]
        assert saved == sorted(saved), "not monotone"
        cap = answers[-1].saved_bytes // 2
        peak = min(a.peak_bytes for a in answers)  # reachable; below 1.0's when a cut is lower
        rows.append((len(graph.nodes), one_call(layers, args.repeats, fraction=1.0),
                     one_call(layers, args.repeats, fraction=0.5),
                     one_call(layers, args.repeats, max_saved_bytes=cap),
                     one_call(layers, args.repeats, max_peak_bytes=peak), sweep,
                     len(set(saved))))
    numpy_ms, core_ms = import_times()
    lines = [
        "| nodes | 1.0 ms | 0.5 ms | byte cap ms | peak cap ms | 33 fractions ms | distinct cuts |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {n} | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} | {e:.0f} | {k} |"
          for n, a, b, c, d, e, k in rows),
        "",
        f"`import aot_partition.core`: {core_ms:.0f} ms after numpy's own {numpy_ms:.0f} ms "
        "(median of 5 fresh interpreters; torch not loaded).",
    ]
    print("\n".join(lines))
    if args.results:
        import numpy
        import scipy

        header = [
            "# The core on its own: budgets on plain data (issue 28, item 2)", "",
            f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; machine: "
            f"{platform.machine()} 2 cores (shared with other engineers' jobs: noisy); "
            f"Python {platform.python_version()}, numpy {numpy.__version__}, scipy "
            f"{scipy.__version__}; torch not imported.", "",
            "Protocol: see `benchmarks/core_budget_bench.py` (one call on a fresh graph, median "
            f"of {args.repeats}; the byte cap is half the runtime-optimal saved bytes, the peak "
            "cap the least peak of the 33 fractions' cuts). A call at 1.0 builds one cut; any "
            "other budget builds the fixed candidate cuts once (33 knapsacks, up to 33 min "
            "cuts), which dominates.", "",
        ]
        (HERE / "RESULTS-core-budget.md").write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
