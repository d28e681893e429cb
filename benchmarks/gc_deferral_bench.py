"""Cold whole-model compile with full garbage collections deferred (``defer_full_gc``).

Model: the built-in Llama (dim 64, 4 heads, SwiGLU hidden 128, seq 16, vocab 64, batch 2) with
``--layers`` blocks (default 8) compiled as ONE graph (``torch.compile(model, ...)``), so one
long Inductor compile allocates millions of objects. One training step (forward, loss,
backward) is timed from ``torch.compile`` to the end of the backward.

Configurations, each in a fresh process with a fresh cache folder (cold), interleaved:

- ``inductor``        ``torch.compile(backend="inductor")``
- ``ours``            ``backend="aot_pipeline"`` (Inductor; full collections deferred, default)
- ``ours_no_defer``   ``backend="aot_pipeline", options={"defer_full_gc": False}``

Recorded per run: this process's CPU seconds (the compile's Python side; the C++ compiler
children are reported apart, they compile the same kernels in all three), the full (generation
2) collections and their CPU seconds (``gc.callbacks``), peak resident memory, and whether the
loss equals eager's. Bytecode cached and ``TORCHINDUCTOR_COMPILE_THREADS=1`` as in
``compile_time_bench.py``.

    uv run python benchmarks/gc_deferral_bench.py --repeats 3 --results
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compile_time_bench import (  # noqa: E402
    _child_env,
    _fill_bytecode_cache,
    _machine,
    add_results_arguments,
    rewrite_from_json,
    save_run,
)

CONFIGS = {
    "inductor": 'torch.compile(backend="inductor")',
    "ours": 'backend="aot_pipeline" (defer_full_gc=True, default)',
    "ours_no_defer": 'backend="aot_pipeline", defer_full_gc=False',
}
SIZES = dict(dim=64, heads=4, seq=16, vocab=64, hidden=128)


def child(config: str, layers: int) -> dict[str, Any]:
    import torch
    import torch._dynamo  # noqa: F401  (before the clock, as in compile_time_bench)
    from aot_pipeline.models import build_model, squared_mean_loss

    if config.startswith("ours"):
        import aot_pipeline.backend  # noqa: F401  (registers the name)

    built = build_model("llama", layers=layers, **SIZES)
    model, inputs = built.module, built.make_inputs()
    eager_loss = float(squared_mean_loss(model(*inputs)))
    model.zero_grad(set_to_none=True)

    full = {"count": 0, "cpu_s": 0.0}
    started = [0.0]

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.process_time()
        else:
            full["count"] += 1
            full["cpu_s"] += time.process_time() - started[0]

    gc.collect()
    gc.callbacks.append(on_collection)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if config == "inductor":
        compiled = torch.compile(model)
    else:
        compiled = torch.compile(model, backend="aot_pipeline",
                                 options={"defer_full_gc": config == "ours"})
    loss = squared_mean_loss(compiled(*inputs))
    loss.backward()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    gc.callbacks.remove(on_collection)
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "config": config, "layers": layers, "cpu_s": cpu, "wall_s": wall,
        "children_cpu_s": (children1.ru_utime + children1.ru_stime
                           - children0.ru_utime - children0.ru_stime),
        "full_collections": full["count"], "full_collection_cpu_s": full["cpu_s"],
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "loss_matches_eager": abs(float(loss) - eager_loss) <= 1e-4 * max(1.0, abs(eager_loss)),
    }


def run_all(layers: int, repeats: int, pycache: str, timeout: float) -> list[dict[str, Any]]:
    env = _child_env(pycache, 1)
    _fill_bytecode_cache(env)
    root = tempfile.mkdtemp(prefix="gc-deferral-bench-")
    runs = []
    try:
        for repeat in range(repeats):
            for config in CONFIGS:
                cache = os.path.join(root, f"{config}-{repeat}")
                os.makedirs(cache)
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", config,
                     "--layers", str(layers)],
                    env={**env, "TORCHINDUCTOR_CACHE_DIR": cache,
                         "TRITON_CACHE_DIR": os.path.join(cache, "triton")},
                    capture_output=True, text=True, timeout=timeout)
                if done.returncode != 0:
                    raise RuntimeError(f"{config} failed:\n{done.stderr[-4000:]}")
                run = json.loads(done.stdout.strip().splitlines()[-1])
                run.update(repeat=repeat, loadavg=os.getloadavg()[0])
                runs.append(run)
                print(f"#{repeat} {config:14s} in-process {run['cpu_s']:.2f} s, "
                      f"{run['full_collections']} full collections "
                      f"({run['full_collection_cpu_s']:.2f} s), children "
                      f"{run['children_cpu_s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return runs


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    base = statistics.median(r["cpu_s"] for r in runs if r["config"] == "inductor")
    for config in CONFIGS:
        group = [r for r in runs if r["config"] == config]
        median = {key: statistics.median(r[key] for r in group)
                  for key in ("cpu_s", "children_cpu_s", "full_collections",
                              "full_collection_cpu_s", "max_rss_mib", "wall_s")}
        rows.append({"config": config, "n": len(group), **median,
                     "cpu_ratio": median["cpu_s"] / base,
                     "all_match_eager": all(r["loss_matches_eager"] for r in group)})
    return rows


def write_markdown(path: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    lines = [
        "# Full garbage collections deferred while compiling (`defer_full_gc`)", "",
        f"Date: {meta['date']}; machine: {meta['machine']}; torch {meta['torch']}, Python "
        f"{meta['python']}; load average {meta['load_start']:.1f} at the start, "
        f"{meta['load_end']:.1f} at the end.", "",
        f"Protocol (`benchmarks/gc_deferral_bench.py`): the built-in Llama with "
        f"{meta['layers']} blocks compiled as one graph, one training step timed from "
        "`torch.compile` to the end of the backward, cold (a fresh process and cache folder per "
        f"run), x{meta['repeats']} interleaved, medians. in-process = this process's CPU "
        "seconds (the compile's Python side, where the collector runs); the C++ compiler "
        "children are shown apart: what they take depends on the kernels the partition needs, "
        "not on the collector. ratio = in-process CPU / Inductor's own back end's.", "",
        "| configuration | in-process CPU s | ratio | full collections | their CPU s |"
        " C++ children CPU s | peak RSS MiB | loss = eager |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {CONFIGS[r['config']]} | {r['cpu_s']:.2f} | {r['cpu_ratio']:.2f} | "
            f"{r['full_collections']:g} | {r['full_collection_cpu_s']:.2f} | "
            f"{r['children_cpu_s']:.2f} | {r['max_rss_mib']:.0f} | "
            f"{'yes' if r['all_match_eager'] else 'NO'} |")
    lines += [""] + [f"- {note}" for note in meta.get("notes", [])]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(),
                                                           "compile-time-bench-pycache"))
    parser.add_argument("--timeout", type=float, default=900.0)
    add_results_arguments(parser, "gc_deferral_bench", "gc-deferral")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.layers)))
        return
    if rewrite_from_json(args, _write_results):
        return
    import torch

    load_start = os.getloadavg()[0]
    runs = run_all(args.layers, args.repeats, args.pycache, args.timeout)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": _machine(), "torch": torch.__version__,
            "python": platform.python_version(), "load_start": load_start,
            "load_end": os.getloadavg()[0], "layers": args.layers, "repeats": args.repeats,
            "notes": args.note}
    save_run(args, {"meta": meta, "summary": summarize(runs), "runs": runs}, _write_results)


def _write_results(payload: dict[str, Any]) -> None:
    with open(os.path.join(HERE, "RESULTS-gc-deferral.json"), "w") as f:
        json.dump(payload, f, indent=1)
    write_markdown(os.path.join(HERE, "RESULTS-gc-deferral.md"), payload["meta"],
                   summarize(payload["runs"]))


if __name__ == "__main__":
    main()
