"""Whole-compile time: ``backend="aot_pipeline"`` against Inductor's own back end (issue 28, item 5).

Model: the built-in Llama (dim 64, 2 blocks, 4 heads, SwiGLU hidden 128, seq 16, vocab 64,
batch 2), each block compiled on its own (``block.compile(backend=...)``); one training step
(forward, loss, backward) is timed from the first ``compile`` call to the end of the backward.

Configurations, each run in a FRESH subprocess:

- ``inductor``       ``backend="inductor"`` (torch's min-cut partitioner inside Inductor)
- ``ours_inductor``  ``backend="aot_pipeline"`` (our partitioner inside Inductor)
- ``ours_made``      ``backend=aot_pipeline.make_backend({...})``: the same back end, made (and
  Inductor imported) before ``compile``, as ``backend="inductor"`` imports it in ``torch.compile``
- ``torch_nop``      ``aot_autograd`` with torch's ``min_cut_rematerialization_partition`` + nop
- ``ours_nop``       ``backend="aot_pipeline", options={"compiler": "nop"}``

The budget goes to torch's ``activation_memory_budget`` flag (torch's partitioner) and to
``options={"memory_budget": ...}`` (ours). Protocol: every (configuration, budget, repeat) gets
its own fresh cache folder (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` under it): the
"cold" process compiles into it, a later "warm" process with the same folder loads from it.
Runs are interleaved (all configurations of one round before the next round). Python bytecode is
cached in one folder shared by all runs (``PYTHONPYCACHEPREFIX``, filled by a first throw-away
process), as an installed torch has its ``.pyc`` files. ``TORCHINDUCTOR_COMPILE_THREADS=1``
(default, ``--compile-threads``) keeps C++ compilation in waited-for child processes, so the CPU
time (this process + its children) counts all of it: on a shared machine the CPU time is the
steadier measure, wall time is reported next to it.

Each run also pre-imports ``torch._dynamo`` (timed on its own, the same for every
configuration), so it can record phases: ``torch._dynamo.utils.compile_times()`` and the
inclusive CPU time of the back end lookup (our entry point import), the pipeline glue
(options, cache key), and each partitioner call (ours or torch's, imports on first use
included).

    uv run python benchmarks/compile_time_bench.py                       # cold x2, warm x2
    uv run python benchmarks/compile_time_bench.py --configs torch_nop ours_nop --repeats 3
    uv run python benchmarks/compile_time_bench.py --results            # also the RESULTS .md

Writes ``benchmarks/out/compile_time_bench.json`` (every run) and with ``--results``
``benchmarks/RESULTS-compile-time.md`` and ``benchmarks/RESULTS-compile-time.json``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "inductor": 'torch.compile(backend="inductor")',
    "ours_inductor": 'backend="aot_pipeline" (Inductor)',
    "ours_made": "backend=aot_pipeline.make_backend(...) (Inductor)",
    "torch_nop": "aot_autograd + torch's min-cut + nop",
    "ours_nop": 'backend="aot_pipeline", compiler="nop"',
}
# Each of ours against the back end it must not be slower than.
BASELINE = {"ours_inductor": "inductor", "ours_made": "inductor", "ours_nop": "torch_nop",
            "inductor": "inductor", "torch_nop": "torch_nop"}
MODEL = dict(dim=64, heads=4, layers=2, seq=16, vocab=64, hidden=128)
# compile_times() keys shown in the phase table.
DYNAMO_PHASES = {
    "_compile.compile_inner": "dynamo (trace + back end)",
    "OutputGraph.call_user_compiler": "back end (AOT + partition + compilers)",
    "create_aot_dispatcher_function": "AOTAutograd (trace, partition, compile)",
    "_recursive_joint_graph_passes": "Inductor joint-graph passes",
    "compile_fx.<locals>.fw_compiler_base": "Inductor forward compile",
    "compile_fx.<locals>.bw_compiler": "Inductor backward compile",
    "min_cut_rematerialization_partition": "torch's partitioner in Inductor",
    "AotPipelinePartitioner": "our partitioner in Inductor",
}


# The child: one configuration, one process.

class _Phases:
    """Inclusive CPU and wall seconds of wrapped functions (nested calls counted once)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._active: set[str] = set()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if name in self._active:
                return fn(*args, **kwargs)
            self._active.add(name)
            cpu, wall = time.process_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._active.discard(name)
                self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - cpu
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - wall
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def patch(self, module: Any, attr: str, name: str) -> None:
        setattr(module, attr, self.wrap(name, getattr(module, attr)))


class Clock:
    """Wall seconds, this process's CPU seconds and its waited-for children's (the C++
    compiler's) since it was made."""

    def __init__(self) -> None:
        import resource

        self._children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def read(self) -> tuple[float, float, float]:
        import resource

        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = (now.ru_utime + now.ru_stime
                    - self._children.ru_utime - self._children.ru_stime)
        return wall, cpu, children


def _ours_partitioner(phases: _Phases) -> None:
    """Time our partitioner where the back end looks it up (``aot_partition``'s lazy attribute),
    its first-use imports included; and the pipeline glue around it."""
    import aot_partition
    import aot_pipeline._compat as compat

    def partition(*args: Any, **kwargs: Any) -> Any:
        from aot_partition.partitioners import min_cut_rematerialization_partition

        return min_cut_rematerialization_partition(*args, **kwargs)

    aot_partition.min_cut_rematerialization_partition = phases.wrap("partitioner", partition)
    import aot_pipeline.backend as backend

    for attr in ("default_options", "partitioner_cache_key", "inductor_config_patches"):
        phases.patch(backend, attr, f"pipeline: {attr}")
    phases.patch(compat, "inductor_config_keys", "pipeline: inductor_config_keys")
    phases.patch(compat, "compile_fx", "pipeline: import compile_fx")


def child(config: str, budget: float) -> dict[str, Any]:
    """Compile and run one step; the timings, counters and phases as a dict."""

    started = time.perf_counter()
    import torch
    from aot_pipeline.models import build_model, squared_mean_loss

    built = build_model("llama", **MODEL)
    model = built.module
    inputs = built.make_inputs()
    eager_loss = float(squared_mean_loss(model(*inputs)))
    model.zero_grad(set_to_none=True)
    import_s = time.perf_counter() - started

    cpu0 = time.process_time()
    import torch._dynamo
    import torch._dynamo.backends.registry as registry
    from torch._dynamo.utils import compile_times, counters

    dynamo_import_cpu = time.process_time() - cpu0
    phases = _Phases()
    phases.patch(registry, "lookup_backend", "lookup_backend (entry point import)")
    if config.startswith("ours"):
        cpu0 = time.process_time()
        _ours_partitioner(phases)
        phases.cpu["import aot_pipeline.backend (before the clock)"] = time.process_time() - cpu0

    # Every configuration starts its clock with the collector's counters at zero, so a
    # collection owed by what each imported before the clock does not fall inside it (a full
    # collection costs 0.2 s here, a tenth of a warm run).
    gc.collect()
    clock = Clock()
    if config == "inductor":
        torch._functorch.config.activation_memory_budget = budget
        # torch.compile(backend="inductor") imports compile_fx itself, before tracing
        # (get_compiler_config); imported here first to time it and patch the partitioner.
        import_cpu = time.process_time()
        import torch._inductor.compile_fx as inductor_compile_fx

        phases.cpu["inductor: import compile_fx (at torch.compile)"] = (
            time.process_time() - import_cpu)
        phases.patch(inductor_compile_fx, "min_cut_rematerialization_partition", "partitioner")
        backend: Any = "inductor"
    elif config == "torch_nop":
        from aot_compilers import nop
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        torch._functorch.config.activation_memory_budget = budget
        backend = aot_autograd(
            fw_compiler=nop, bw_compiler=nop, keep_inference_input_mutations=True,
            partition_fn=phases.wrap("partitioner", min_cut_rematerialization_partition))
    elif config == "ours_made":
        import aot_pipeline

        backend = aot_pipeline.make_backend({"memory_budget": budget, "compiler": "inductor"})
    else:
        backend = "aot_pipeline"
    options = ({"memory_budget": budget, "compiler": "nop" if config == "ours_nop" else "inductor"}
               if config in ("ours_inductor", "ours_nop") else None)
    for block in model.blocks:
        block.compile(backend=backend, options=options)
    loss = squared_mean_loss(model(*inputs))
    loss.backward()
    wall, cpu, children_cpu = clock.read()
    headers, values = compile_times(repr="csv", aggregate=True)
    return {
        "config": config, "budget": budget, "wall_s": wall, "cpu_s": cpu,
        "children_cpu_s": children_cpu, "total_cpu_s": cpu + children_cpu,
        "import_s": import_s, "dynamo_import_cpu_s": dynamo_import_cpu,
        "loss_matches_eager": abs(float(loss) - eager_loss) <= 1e-4 * max(1.0, abs(eager_loss)),
        "counters": {k: dict(v) for k, v in counters.items()
                     if k in ("aot_autograd", "inductor", "stats")},
        "dynamo_phases_s": {h: float(v) for h, v in zip(headers, values)},
        "phases_cpu_s": phases.cpu, "phases_wall_s": phases.wall, "phase_calls": phases.calls,
    }


# The parent: fresh processes, interleaved.

def _run_child(config: str, budget: float, cache_dir: str, env: dict[str, str],
               timeout: float) -> dict[str, Any]:
    run_env = {**env, "TORCHINDUCTOR_CACHE_DIR": cache_dir,
               "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton")}
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", config, "--budget", str(budget)],
        env=run_env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{config} at budget {budget} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child_env(pycache: str, compile_threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    if compile_threads is not None:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(compile_threads)
    return env


def _fill_bytecode_cache(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c",
                    "import torch._dynamo, torch._inductor.compile_fx, "
                    "torch._functorch.partitioners, aot_pipeline.registered, aot_compilers, "
                    "aot_partition.partitioners, aot_partition.core.mincut_scipy"],
                   env=env, check=True, capture_output=True, timeout=900)


def run_all(configs: list[str], budgets: list[float], repeats: int, warm: int,
            compile_threads: int | None, timeout: float, log: Callable[[str], None],
            pycache: str) -> list[dict[str, Any]]:
    root = tempfile.mkdtemp(prefix="compile-time-bench-")
    env = _child_env(pycache, compile_threads)
    log(f"filling the bytecode cache in {pycache}")
    _fill_bytecode_cache(env)
    runs: list[dict[str, Any]] = []
    try:
        rounds = [("cold", r) for r in range(repeats)] + [("warm", r % repeats)
                                                          for r in range(warm)]
        for round_index, (kind, repeat) in enumerate(rounds):
            for budget in budgets:
                for config in configs:
                    cache_dir = os.path.join(root, f"{config}-{budget}-{repeat}")
                    os.makedirs(cache_dir, exist_ok=True)
                    result = _run_child(config, budget, cache_dir, env, timeout)
                    result.update(kind=kind, repeat=repeat, round=round_index,
                                  loadavg=os.getloadavg()[0])
                    runs.append(result)
                    log(f"{kind} #{repeat} {config:14s} budget {budget}: wall "
                        f"{result['wall_s']:.2f} s, cpu {result['total_cpu_s']:.2f} s "
                        f"(load {result['loadavg']:.1f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return runs


def _round_ratios(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[float]:
    """Total-CPU ratio of each round to the baseline's run of the same round (the two ran
    back to back, so a slow spell of the machine mostly hits both). Empty for runs recorded
    without round numbers."""
    base = {r["round"]: r["total_cpu_s"] for r in baseline if "round" in r}
    return sorted(r["total_cpu_s"] / base[r["round"]] for r in runs
                  if r.get("round") in base)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median wall and CPU per (configuration, budget, cold/warm), with ratios to the
    baseline (ours / baseline: at most 1 means no slower)."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["config"], run["budget"], run["kind"]), []).append(run)
    medians = {key: {"wall_s": statistics.median(r["wall_s"] for r in group),
                     "cpu_s": statistics.median(r["total_cpu_s"] for r in group),
                     "self_cpu_s": statistics.median(r["cpu_s"] for r in group),
                     "n": len(group)} for key, group in groups.items()}
    rows = []
    for (config, budget, kind), m in medians.items():
        base = medians.get((BASELINE[config], budget, kind))
        rows.append({"config": config, "budget": budget, "kind": kind, **m,
                     "baseline": BASELINE[config],
                     "wall_ratio": m["wall_s"] / base["wall_s"] if base else None,
                     "cpu_ratio": m["cpu_s"] / base["cpu_s"] if base else None,
                     "self_cpu_ratio": m["self_cpu_s"] / base["self_cpu_s"] if base else None,
                     "round_cpu_ratios": _round_ratios(groups[(config, budget, kind)],
                                                       groups.get((BASELINE[config], budget,
                                                                   kind), [])),
                     "all_match_eager": all(r["loss_matches_eager"]
                                            for r in groups[(config, budget, kind)])})
    order = list(CONFIGS)
    rows.sort(key=lambda r: (r["kind"] != "cold", r["budget"] != 1.0, -r["budget"],
                             order.index(r["config"])))
    return rows


def phase_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median CPU seconds of each recorded phase per (configuration, budget, cold/warm)."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["config"], run["budget"], run["kind"]), []).append(run)
    rows = []
    for (config, budget, kind), group in sorted(groups.items(),
                                                key=lambda kv: (kv[0][2], -kv[0][1], kv[0][0])):
        phases: dict[str, float] = {
            "import torch._dynamo (before the clock)": statistics.median(
                r["dynamo_import_cpu_s"] for r in group)}
        names = sorted({n for r in group for n in r["phases_cpu_s"]})
        for name in names:
            phases[name] = statistics.median(r["phases_cpu_s"].get(name, 0.0) for r in group)
        for key, label in DYNAMO_PHASES.items():
            values = [r["dynamo_phases_s"].get(key) for r in group]
            if any(v is not None for v in values):
                phases[f"{label} [wall]"] = statistics.median(v or 0.0 for v in values)
        rows.append({"config": config, "budget": budget, "kind": kind, "phases": phases})
    return rows


def _machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores (shared), {platform.system()}"


def write_markdown(path: str, meta: dict[str, Any], rows: list[dict[str, Any]],
                   phases: list[dict[str, Any]]) -> None:
    lines = [
        "# Whole-compile time: aot_pipeline against Inductor's own back end (issue 28, item 5)",
        "",
        f"Date: {meta['date']}; machine: {meta['machine']}; torch {meta['torch']}; "
        f"load average {meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end "
        "(on a shared VM the CPU times are steadier than the wall times).",
        "",
        "Protocol (`benchmarks/compile_time_bench.py`): the built-in Llama (dim 64, 2 blocks, "
        "each block compiled on its own), one step (forward, loss, backward) timed from the "
        "first `compile` call to the end of the backward, in a fresh process per run with a "
        "fresh cache folder per (configuration, budget, repeat) (`TORCHINDUCTOR_CACHE_DIR`, "
        "`TRITON_CACHE_DIR`); warm = a later process with the same folder. "
        f"Cold x{meta['repeats']}, warm x{meta['warm']}, interleaved; medians. Bytecode "
        "cached (`PYTHONPYCACHEPREFIX`, as installed packages have `.pyc` files); "
        f"`TORCHINDUCTOR_COMPILE_THREADS={meta['compile_threads']}`, so CPU = this process + "
        "its C++ compiler children. `torch._dynamo` is imported before the clock in every "
        "run (same for all). ratio = ours / baseline (at most 1.00: no slower); per round: "
        "the lowest and highest ratio of one run to the baseline's run of the same round "
        "(back to back); in-process: this process's CPU alone (the C++ compiler children "
        "compile the same kernels for both when the partitions agree).",
        "",
        "| run | budget | configuration | wall s | CPU s | baseline | wall ratio | CPU ratio |"
        " per round | in-process | loss = eager |",
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio_w = f"{r['wall_ratio']:.2f}" if r["wall_ratio"] is not None else "-"
        ratio_c = f"{r['cpu_ratio']:.2f}" if r["cpu_ratio"] is not None else "-"
        rounds = r.get("round_cpu_ratios") or []
        spread = (f"{rounds[0]:.2f}-{rounds[-1]:.2f}"
                  if rounds and r["config"] != r["baseline"] else "-")
        in_process = (f"{r['self_cpu_ratio']:.2f}" if r.get("self_cpu_ratio") is not None
                      else "-")
        lines.append(
            f"| {r['kind']} | {r['budget']:g} | {CONFIGS[r['config']]} | {r['wall_s']:.2f} | "
            f"{r['cpu_s']:.2f} | {r['baseline']} | {ratio_w} | {ratio_c} | {spread} | "
            f"{in_process} | "
            f"{'yes' if r['all_match_eager'] else 'NO'} |")
    lines += ["", "## Phases", "",
              "Median CPU seconds, inclusive (a phase may contain another); [wall]: "
              "`torch._dynamo.utils.compile_times()`, wall seconds, inflated by the load. "
              "Inductor's own back end imports `compile_fx` inside `torch.compile`, before "
              "tracing (`inductor: import compile_fx (at torch.compile)`); `backend=\"aot_pipeline\"` "
              "at its first graph, inside Dynamo's compile, `make_backend` at its call, before "
              "`compile` (both `pipeline: import compile_fx`).",
              ""]
    by_run: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for p in phases:
        by_run.setdefault((p["kind"], p["budget"]), []).append(p)
    for (kind, budget), group in by_run.items():
        group.sort(key=lambda p: list(CONFIGS).index(p["config"]))
        names = list(dict.fromkeys(n for p in group for n in p["phases"]))
        lines += [f"{kind}, budget {budget:g}:", "",
                  "| phase | " + " | ".join(p["config"] for p in group) + " |",
                  "|---|" + "---:|" * len(group)]
        for name in names:
            cells = [f"{p['phases'][name]:.3f}" if name in p["phases"] else "-" for p in group]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["", *meta.get("notes", [])]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--budgets", nargs="+", type=float, default=[1.0, 0.5])
    parser.add_argument("--repeats", type=int, default=2, help="cold runs per configuration")
    parser.add_argument("--warm", type=int, default=2, help="warm runs per configuration")
    parser.add_argument("--compile-threads", type=int, default=1,
                        help="TORCHINDUCTOR_COMPILE_THREADS (0: leave Inductor's default)")
    parser.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(),
                                                          "compile-time-bench-pycache"),
                        help="PYTHONPYCACHEPREFIX of the runs (kept, so a rerun skips filling it)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    add_results_arguments(parser, "compile_time_bench", "compile-time")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.budget)))
        return
    if rewrite_from_json(args, _write_results):
        return
    import torch

    load_start = os.getloadavg()[0]
    runs = run_all(args.configs, args.budgets, args.repeats, args.warm,
                   args.compile_threads or None, args.timeout,
                   lambda message: print(message, flush=True), args.pycache)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": _machine(), "torch": torch.__version__, "python": platform.python_version(),
            "load_start": load_start, "load_end": os.getloadavg()[0], "repeats": args.repeats,
            "warm": args.warm, "compile_threads": args.compile_threads or "default",
            "model": MODEL, "notes": args.note}
    rows = summarize(runs)
    save_run(args, {"meta": meta, "summary": rows, "phases": phase_table(runs), "runs": runs},
             _write_results)


def add_results_arguments(parser: argparse.ArgumentParser, script: str, results: str) -> None:
    """--out, --results, --note and --from-json, shared with gc_deferral_bench.py."""
    parser.add_argument("--out", default=os.path.join(HERE, "out", f"{script}.json"))
    parser.add_argument("--results", action="store_true",
                        help=f"also write benchmarks/RESULTS-{results}.md and .json")
    parser.add_argument("--note", action="append", default=[], help="a line for the .md")
    parser.add_argument("--from-json", metavar="PATH",
                        help="no runs: write the RESULTS files from an earlier --out JSON")


def rewrite_from_json(args: argparse.Namespace,
                      write: Callable[[dict[str, Any]], None]) -> bool:
    """With --from-json: the RESULTS files rewritten from that run (new notes if given)."""
    if not args.from_json:
        return False
    with open(args.from_json) as f:
        payload = json.load(f)
    payload["meta"]["notes"] = args.note or payload["meta"].get("notes", [])
    write(payload)
    return True


def save_run(args: argparse.Namespace, payload: dict[str, Any],
             write: Callable[[dict[str, Any]], None]) -> None:
    """The run's JSON to --out, its summary to stdout, and with --results the RESULTS files."""
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=1)
    print(json.dumps(payload["summary"], indent=1))
    if args.results:
        write(payload)


def _write_results(payload: dict[str, Any]) -> None:
    with open(os.path.join(HERE, "RESULTS-compile-time.json"), "w") as f:
        json.dump(payload, f, indent=1)
    write_markdown(os.path.join(HERE, "RESULTS-compile-time.md"), payload["meta"],
                   summarize(payload["runs"]), phase_table(payload["runs"]))


if __name__ == "__main__":
    main()
