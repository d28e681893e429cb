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

``--scale`` (issue 41, item 4) times ``partition_under_budget`` at 0.5 on a fresh graph
(building and loading not timed, median of ``--repeats``; scipy imported before the clock) on a
50,000-node chain (25,000 forward nodes, 7 runtime kinds, and its backward) and on GPT-32's core
graph: the built-in GPT with 32 layers traced by AOTAutograd (torch needed), described by the fx
adapter (``fx_core_graph``: the fx path's bans written into the nodes), once as the adapter gives
it (no runtimes) and once with each forward node's ``runtime`` set to its roofline estimate in
microseconds. It also prints the jaxpr-like transformer's ``dots_saveable`` comparison of
``tests/aot_partition/test_core_budget_resolution.py``.

    uv run python benchmarks/core_budget_bench.py --scale
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


def chain(forward: int = 25_000, kinds: int = 7) -> CoreGraph:
    """x -> f0 -> ... -> f{forward-1} and the backward reading each: 2 * forward + 2 nodes."""
    nodes = [CoreNode("x", nbytes=64, category="input", forward=True)]
    prev = "x"
    for i in range(forward):
        nodes.append(CoreNode(f"f{i}", (prev,), nbytes=64 * (1 + i % 3), category="pointwise",
                              forward=True, runtime=float(1 + i % kinds)))
        prev = f"f{i}"
    nodes.append(CoreNode("g", nbytes=64, category="tangent", in_backward=True))
    back = "g"
    for i in reversed(range(forward)):
        nodes.append(CoreNode(f"b{i}", (back, f"f{i}"), nbytes=64, category="pointwise",
                              in_backward=True, backward=i == 0))
        back = f"b{i}"
    return CoreGraph(tuple(nodes))


def sparse_chain(forward: int = 25_000, every: int = 100, nbytes: int = 4096) -> CoreGraph:
    """Issue 51's chain: uniform runtimes and bytes, every ``every``-th forward value read by the
    backward (2 * forward + 2 nodes)."""
    nodes = [CoreNode("x", nbytes=nbytes, category="input", forward=True)]
    prev = "x"
    for i in range(forward):
        nodes.append(CoreNode(f"f{i}", (prev,), nbytes=nbytes, category="pointwise",
                              forward=True, runtime=1.0))
        prev = f"f{i}"
    nodes.append(CoreNode("g", nbytes=nbytes, category="tangent", in_backward=True))
    back = "g"
    for i in reversed(range(forward)):
        reads = (back, f"f{i}") if i % every == 0 else (back,)
        nodes.append(CoreNode(f"b{i}", reads, nbytes=nbytes, category="pointwise",
                              in_backward=True, backward=i == 0))
        back = f"b{i}"
    return CoreGraph(tuple(nodes))


def random_dag(forward: int = 25_000, seed: int = 0, window: int = 50) -> CoreGraph:
    """A random training step: each forward node reads 1 to 3 of the 50 values before it (4
    categories, 4 sizes, runtimes 0 to 20); each backward node reads the backward value before
    it, half of them a forward value too, mirrored (2 * forward + 3 nodes)."""
    import random

    rng = random.Random(seed)
    categories = ["pointwise", "compute", "reduction", "view"]
    nodes = [CoreNode("x", nbytes=1024, category="input", forward=True),
             CoreNode("p", nbytes=4096, category="parameter", forward=True)]
    fw = ["x", "p"]
    for i in range(forward):
        reads = tuple(sorted({rng.choice(fw[-window:]) for _ in range(rng.randint(1, 3))}))
        nodes.append(CoreNode(f"f{i}", reads, nbytes=rng.choice([64, 256, 1024, 4096]),
                              category=rng.choice(categories), forward=True,
                              runtime=float(rng.choice([0, 1, 2, 5, 20]))))
        fw.append(f"f{i}")
    nodes.append(CoreNode("g", nbytes=64, category="tangent", in_backward=True))
    back = "g"
    for i in range(forward):
        reads = {back, fw[-1 - i]} if rng.random() < 0.5 else {back}
        nodes.append(CoreNode(f"b{i}", tuple(sorted(reads)), nbytes=rng.choice([64, 1024]),
                              category=rng.choice(categories), in_backward=True,
                              backward=i == forward - 1))
        back = f"b{i}"
    return CoreGraph(tuple(nodes))


LARGE_SHAPES = {
    "chain, every 100th value read (issue 51)": sparse_chain,
    "chain, 7 runtime kinds, every value read": chain,
    "deep MLP, 6,250 layers": lambda: deep_mlp(6250),
    "random DAG": random_dag,
}
LARGE_BUDGETS = ("0.0", "0.2", "0.5", "0.8", "1.0", "byte cap", "peak cap")


def large(shapes: list[str] | None = None) -> list[str]:
    """One ``partition_under_budget`` call per cell on a fresh 50,000-node graph (building not
    timed): CPU seconds (process time) and wall seconds. The byte cap is 37% of the way from
    the least saved bytes to the runtime-optimal cut's, the peak cap 95% of the runtime-optimal
    cut's simulated peak (both found on another copy, not timed; a refusal is timed too)."""
    lines = ["| graph | nodes | budget | CPU s | wall s | min cuts run | cuts reused | answer |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for label, make in LARGE_SHAPES.items():
        if shapes and not any(s in label for s in shapes):
            continue
        probe = make()
        low = partition_under_budget(probe, fraction=0.0)
        high = partition_under_budget(probe, fraction=1.0)
        byte_cap = int(low.saved_bytes + 0.37 * (high.saved_bytes - low.saved_bytes))
        peak_cap = int(0.95 * high.peak_bytes)
        del probe
        for budget in LARGE_BUDGETS:
            kwargs: dict[str, float] = (
                {"max_saved_bytes": byte_cap} if budget == "byte cap" else
                {"max_peak_bytes": peak_cap} if budget == "peak cap" else
                {"fraction": float(budget)})
            graph = make()
            cpu, wall = time.process_time(), time.perf_counter()
            try:
                answer = partition_under_budget(graph, **kwargs)  # type: ignore[arg-type]
                said = answer.label
            except Exception as exc:  # noqa: BLE001 - a refusal is an answer too
                said = f"{type(exc).__name__}"
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            flows = reused = 0
            for key, value in graph._cache.items():
                if isinstance(key, tuple) and key[0] == "core-budget":
                    for family in getattr(value, "_families", {}).values():
                        flows, reused = flows + family.flows, reused + family.reused
            lines.append(f"| {label} | {len(graph.nodes)} | {budget} | {cpu:.2f} | {wall:.2f} | "
                         f"{flows} | {reused} | {said} |")
            print(lines[-1], flush=True)
    return lines


def gpt32_core_graphs() -> tuple[list[dict], list[dict]]:
    """GPT-32's core graph as plain dicts: (as the fx adapter gives it, with runtimes)."""
    import copy
    from dataclasses import replace

    from aot_partition.config import MinCutOptions, PartitionConfig
    from aot_partition.costs.estimators import roofline_runtime
    from aot_partition.fx.classify import classify, default_op_types
    from aot_partition.fx.network import fx_core_graph
    from aot_partition.fx.policy import PolicyContext
    from aot_partition.fx.prepare import prepared_joint
    from aot_pipeline.models import build_model
    from functorch.compile import aot_module, make_boxed_func  # type: ignore[import-untyped]
    from torch._functorch import partitioners as torch_partitioners

    built = build_model("gpt", layers=32)
    found = []

    def recording(joint, joint_inputs, **kwargs):
        found.append((copy.deepcopy(joint), kwargs["num_fwd_outputs"]))
        return torch_partitioners.default_partition(joint, joint_inputs, **kwargs)

    aot_module(built.module, fw_compiler=lambda g, _: make_boxed_func(g),
               bw_compiler=lambda g, _: make_boxed_func(g),
               partition_fn=recording)(*built.make_inputs())
    joint, num_fwd_outputs = found[0]
    with prepared_joint(joint, num_fwd_outputs):
        info = classify(joint, num_fwd_outputs)
        ctx = PolicyContext.create(default_op_types(), info, MinCutOptions(), PartitionConfig())
        graph = fx_core_graph(joint.graph, ctx)
        fx_nodes = {n.name: n for n in joint.graph.nodes}
        timed = []
        for node in graph.nodes:
            fx_node = fx_nodes[node.id]
            runtime = 0.0
            if node.forward and fx_node.op == "call_function":
                try:
                    runtime = float(roofline_runtime(fx_node)) * 1e6
                except Exception:  # noqa: BLE001 - an op the estimator cannot price: 0
                    runtime = 0.0
            timed.append(replace(node, runtime=runtime))
    return graph.to_dicts(), CoreGraph(tuple(timed)).to_dicts()


def scale(repeats: int) -> list[str]:
    """Lines: the 50,000-node chain and GPT-32's core graph at 0.5; the dots_saveable check."""
    def timed(make: object, label: str) -> str:
        times = []
        for _ in range(repeats):
            graph = make()  # type: ignore[operator]
            start = time.perf_counter()
            answer = partition_under_budget(graph, fraction=0.5)
            times.append(time.perf_counter() - start)
        return (f"| {label} | {len(graph.nodes)} | {statistics.median(times) * 1e3:.0f} | "
                f"{min(times) * 1e3:.0f} | {answer.label} |")

    lines = ["| graph | nodes | 0.5 median ms | 0.5 best ms | answer |", "|---|---:|---:|---:|---|",
             timed(chain, "chain, 25,000 forward nodes")]
    try:
        plain, with_runtimes = gpt32_core_graphs()
    except ImportError as exc:  # the core alone: no torch
        lines.append(f"(GPT-32 skipped: {exc})")
    else:
        lines += [timed(lambda: CoreGraph.from_dicts(plain), "GPT-32 core graph (adapter)"),
                  timed(lambda: CoreGraph.from_dicts(with_runtimes),
                        "GPT-32 core graph + roofline runtimes")]
    sys.path.insert(0, str(HERE.parent / "tests"))
    from jaxpr_graphs import (  # type: ignore[import-not-found]
        policy_cut,
        transformer_step,
    )

    graph, batched = transformer_step()
    for name, saveable in (("dots_saveable", lambda n: n.op == "dot_general"),
                           ("dots_with_no_batch_dims_saveable",
                            lambda n: n.op == "dot_general" and n.id not in batched)):
        nbytes, flops = policy_cut(graph, saveable)
        ours = partition_under_budget(graph, max_saved_bytes=nbytes)
        lines.append(f"- transformer ({len(graph.nodes)} nodes), jax {name}: saves {nbytes:,} "
                     f"bytes, recomputes {flops:,.0f} FLOPs; the core under that cap saves "
                     f"{ours.saved_bytes:,}, recomputes {ours.recompute_runtime:,.0f}")
    answers = [partition_under_budget(graph, fraction=i / 32) for i in range(33)]
    lines.append(f"- transformer: 33 fractions give {len({a.saved for a in answers})} distinct "
                 "cuts")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", action="store_true",
                        help="write benchmarks/RESULTS-core-budget.md")
    parser.add_argument("--large", nargs="*", metavar="SHAPE",
                        help="only the 50,000-node shapes (issue 51), all or those whose "
                             "label contains a SHAPE word, at 5 fractions and 2 caps (printed)")
    parser.add_argument("--scale", action="store_true",
                        help="only the 50,000-node chain, GPT-32 and dots_saveable (printed)")
    args = parser.parse_args()
    if args.large is not None:
        partition_under_budget(deep_mlp(2), fraction=0.5)  # scipy's first import, not timed
        large(args.large)
        return
    if args.scale:
        partition_under_budget(deep_mlp(2), fraction=0.5)  # scipy's first import, not timed
        print("\n".join(scale(args.repeats)))
        return
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
