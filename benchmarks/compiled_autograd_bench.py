"""Backward time of a 12-block GPT under eager autograd, torch's compiled autograd and ours.

Both compiled autograds hand their graph to the same Inductor ``compiler_fn``; the forward is
eager. A second table measures the per-step cost of the cache-hit path alone: the compiled
function is a no-op, so what remains is the C++ cache lookup plus each side's runtime wrapper.

Each variant runs in a fresh subprocess: in one process, whichever variant runs later is
slower (2 blocks: ours 2.35 ms first, torch's 3.00 ms second, ours again 4.97 ms third; it is
not the garbage collector), so a shared process would bias the comparison by order.

Writes ``benchmarks/out/compiled_autograd_bench.json`` and, with ``--results``,
``benchmarks/RESULTS-compiled-autograd.md``.

    uv run python benchmarks/compiled_autograd_bench.py [--steps 20] [--layers 12] [--results]
    # one variant per process, e.g. to run them side by side, then merge their JSON files:
    uv run python benchmarks/compiled_autograd_bench.py --variants ours --out out/ours
    uv run python benchmarks/compiled_autograd_bench.py --merge out/*/compiled_autograd_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from typing import Any

import compiled_autograd
import torch
from aot_pipeline.models import build_model
from torch._dynamo import compiled_autograd as torch_compiled_autograd

HERE = os.path.dirname(os.path.abspath(__file__))


def inductor(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    return torch.compile(gm, backend="inductor", fullgraph=True)


def skip_graph(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """A compiled function that does nothing: isolates the cache-hit overhead."""
    return lambda *args: []


def time_backward(model: torch.nn.Module, inputs: tuple, context: Callable[[], AbstractContextManager],
                  steps: int, warmup: int) -> tuple[list[float], float]:
    """Per-step backward seconds (forward excluded) and the time of the first (compiling) step."""
    times: list[float] = []
    first = 0.0
    for step in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        loss = model(*inputs).float().pow(2).mean()
        with context():
            start = time.perf_counter()
            loss.backward()
            elapsed = time.perf_counter() - start
        if step == 0:
            first = elapsed
        if step >= warmup:
            times.append(elapsed)
    return times, first


def summarise(name: str, times: list[float], first: float) -> dict[str, Any]:
    return {"variant": name, "median_ms": 1e3 * statistics.median(times),
            "min_ms": 1e3 * min(times), "first_step_s": first, "steps": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true",
                        help="also write benchmarks/RESULTS-compiled-autograd.md")
    parser.add_argument("--variants", default="",
                        help=f"comma-separated subset to run in THIS process: {', '.join(VARIANTS)}")
    parser.add_argument("--merge", nargs="+", default=[],
                        help="render these JSON files (one per variant run) as one table")
    args = parser.parse_args()
    if args.merge:
        return merge(args)
    if not args.variants:
        return run_isolated(args)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; valid: {', '.join(VARIANTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    built = build_model("gpt", layers=args.layers)
    model, inputs = built.module, built.make_inputs()
    chosen = args.variants.split(",")
    runs = dict(VARIANTS[v] for v in chosen if not v.endswith("-hit"))
    overhead_runs = dict(VARIANTS[v] for v in chosen if v.endswith("-hit"))
    meta = {"machine": f"{platform.node()} {platform.machine()} {platform.processor()}".strip(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "model": f"gpt layers={args.layers} (aot_pipeline.models defaults)",
            "steps": args.steps, "warmup": args.warmup}
    os.makedirs(args.out, exist_ok=True)
    rows: list[dict] = []
    overhead: list[dict] = []
    for table, variants in ((rows, runs), (overhead, overhead_runs)):
        for name, context in variants.items():
            compiled_autograd.reset()  # the engine cache ignores compilers: start each clean
            torch._dynamo.reset()
            times, first = time_backward(model, inputs, context, args.steps, args.warmup)
            table.append(summarise(name, times, first))
            print(f"{name:40s} median {table[-1]['median_ms']:8.3f} ms  "
                  f"min {table[-1]['min_ms']:8.3f} ms  first step {first:7.2f} s", flush=True)
            # written after every variant, so a run cut short still leaves its numbers
            with open(os.path.join(args.out, "compiled_autograd_bench.json"), "w") as f:
                json.dump({"meta": meta, "backward": rows, "cache_hit_overhead": overhead}, f,
                          indent=2)
    compiled_autograd.reset()
    markdown = render(meta, rows, overhead)
    print(markdown)
    if args.results:
        with open(os.path.join(HERE, "RESULTS-compiled-autograd.md"), "w") as f:
            f.write(markdown)


# name on the command line -> (label in the tables, context the backward runs in)
VARIANTS: dict[str, tuple[str, Callable[[], AbstractContextManager]]] = {
    "eager": ("eager autograd", lambda: nullcontext()),
    "torch": ("torch compiled autograd + inductor",
              lambda: torch_compiled_autograd._enable(inductor)),
    "ours": ("ours + inductor", lambda: compiled_autograd.enable(inductor)),
    "torch-hit": ("torch compiled autograd, cache hit",
                  lambda: torch_compiled_autograd._enable(skip_graph)),
    "ours-hit": ("ours, cache hit", lambda: compiled_autograd.enable(skip_graph)),
}


def run_isolated(args: argparse.Namespace) -> None:
    """Every variant in its own subprocess, one after the other; then one table."""
    paths = []
    for variant in VARIANTS:
        out = os.path.join(args.out, variant)
        command = [sys.executable, os.path.abspath(__file__), "--variants", variant,
                   "--layers", str(args.layers), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--threads", str(args.threads), "--out", out]
        subprocess.run(command, check=True)
        paths.append(os.path.join(out, "compiled_autograd_bench.json"))
    args.merge = paths
    merge(args)


def merge(args: argparse.Namespace) -> None:
    rows: list[dict] = []
    overhead: list[dict] = []
    meta: dict = {}
    for path in args.merge:
        with open(path) as f:
            part = json.load(f)
        meta = meta or part["meta"]
        rows += part["backward"]
        overhead += part["cache_hit_overhead"]
    meta = {**meta, "isolation": "each variant in its own process"}
    markdown = render(meta, rows, overhead)
    print(markdown)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compiled_autograd_bench.json"), "w") as f:
        json.dump({"meta": meta, "backward": rows, "cache_hit_overhead": overhead}, f, indent=2)
    if args.results:
        with open(os.path.join(HERE, "RESULTS-compiled-autograd.md"), "w") as f:
            f.write(markdown)


def render(meta: dict, rows: list[dict], overhead: list[dict]) -> str:
    lines = ["## Compiled autograd: backward time (CPU)", "",
             f"Machine: {meta['machine']}, {meta['cpus']} CPUs, {meta['torch_threads']} torch "
             f"threads; torch {meta['torch']}, Python {meta['python']}; {meta['date']}.",
             f"Model: {meta['model']}, eager forward; median of {meta['steps']} backward steps "
             f"after {meta['warmup']} warm-up steps (the first step includes capture and "
             f"compilation); {meta.get('isolation', 'this process ran only these variants')}.", "",
             "| variant | median ms | min ms | first step s |", "|---|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | "
              f"{r['first_step_s']:.2f} |" for r in rows]
    lines += ["", "Cache-hit path alone (the compiled function is a no-op, so this is the "
              "engine's cache lookup plus the runtime wrapper):", "",
              "| variant | median ms | min ms |", "|---|---:|---:|"]
    lines += [f"| {r['variant']} | {r['median_ms']:.3f} | {r['min_ms']:.3f} |" for r in overhead]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
