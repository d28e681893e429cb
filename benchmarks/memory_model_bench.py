"""Memory-model benchmark: simulated against measured peak memory of one training step.

For each model and activation-memory budget, our min-cut partitioner splits the model's joint
graph; ``aot_partition.memory_models.simulator.simulate_partition`` predicts the step's peak (forward, then
backward) and ``measure_partition`` runs the two graphs for real: on CPU the peak is rebuilt
from the profiler's allocation events, on CUDA it is ``max_memory_allocated``. Both are relative
to the memory allocated before the step (parameters and inputs). Two simulated columns: the
fx-level model alone, and with op workspaces (bytes a kernel allocates and frees internally,
measured once per distinct op by ``profiled_workspace``).

Writes ``benchmarks/out/memory_model_bench.json``, ``.md`` and one timeline PNG per model
(budget 1.0); ``benchmarks/out/`` is git-ignored.

    uv run python benchmarks/memory_model_bench.py            # zoo + gpt-32 (a minute on CPU)
    uv run python benchmarks/memory_model_bench.py --smoke    # two tiny models, one budget
    uv run python benchmarks/memory_model_bench.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.fx as fx
from aot_partition import default_partition
from aot_partition.memory_models.simulator import measure_partition, simulate_partition
from aot_partition.partitioners import partition_with_report
from aot_pipeline.models import build_model
from functorch.compile import aot_module, make_boxed_func

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from zoo import ZOO  # noqa: E402

log = logging.getLogger(__name__)

BUDGETS = (1.0, 0.5, 0.0)
# Bigger than the zoo: deep transformer stacks, still quick on CPU.
EXTRA: dict[str, dict[str, Any]] = {
    "gpt-32": {"name": "gpt", "layers": 32},
    "llama-8": {"name": "llama", "layers": 8},
}
# GPT-2 size (d 768, 12 layers, 12 heads, vocab 50304, seq 1024, batch 8, SDPA), as in
# gpu_train_bench.py: in the default list only on CUDA (gigabytes of activations).
GPU_EXTRA: dict[str, dict[str, Any]] = {
    "gpt2-size": {"name": "gpt", "vocab": 50304, "dim": 768, "heads": 12, "layers": 12,
                  "seq": 1024, "sdpa": True, "batch": 8},
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SMOKE = ("mlp", "gpt")
CUDA_ALIGNMENT = 512  # the caching allocator rounds every block up to 512 bytes


@dataclass
class Joint:
    label: str
    module: fx.GraphModule
    num_fwd_outputs: int
    num_static_inputs: int


@dataclass
class Row:
    model: str
    nodes: int
    budget: float
    device: str
    saved_bytes: int
    simulated: int            # fx-level model, bytes above the step's inputs
    simulated_workspace: int  # plus op workspaces
    measured: int
    error_pct: float          # (simulated - measured) / measured
    error_workspace_pct: float
    peak_at: str
    simulate_s: float
    measure_s: float


def _model(label: str, device: str,
           dtype: torch.dtype) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)

    if label in ZOO:
        case = ZOO[label]()
        return case.module.to(device=device, dtype=dtype), tuple(map(cast, case.inputs))
    spec = dict({**EXTRA, **GPU_EXTRA}[label])
    built = build_model(spec.pop("name"), device=device, **spec)
    return built.module.to(dtype), tuple(map(cast, built.make_inputs()))


def capture(label: str, device: str, dtype: torch.dtype = torch.float32) -> Joint:
    """The model's joint graph, as AOTAutograd hands it to a partitioner."""
    module, inputs = _model(label, device, dtype)
    record: dict[str, Joint] = {}
    static = len(list(module.parameters())) + len(list(module.buffers()))

    def recording(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        record["joint"] = Joint(label, copy.deepcopy(joint), num_fwd_outputs, static)
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def nop(gm: fx.GraphModule, _: Any) -> Callable:
        return make_boxed_func(gm)

    aot_module(module, fw_compiler=nop, bw_compiler=nop, partition_fn=recording)(*inputs)
    return record["joint"]


def _error(simulated: int, measured: int) -> float:
    return 100.0 * (simulated - measured) / measured if measured else 0.0


def run_case(joint: Joint, budget: float, device: str, png_dir: str | None) -> Row:
    fw, bw, report = partition_with_report(copy.deepcopy(joint.module),
                                           num_fwd_outputs=joint.num_fwd_outputs,
                                           memory_budget=budget)
    alignment = CUDA_ALIGNMENT if device.startswith("cuda") else 1
    start = time.perf_counter()
    plain = simulate_partition(fw, bw, num_static_inputs=joint.num_static_inputs,
                               alignment=alignment)
    simulate_s = time.perf_counter() - start
    with_ws = simulate_partition(fw, bw, num_static_inputs=joint.num_static_inputs,
                                 alignment=alignment, workspace="profile")
    start = time.perf_counter()
    measured = measure_partition(fw, bw, device=device)
    measure_s = time.perf_counter() - start
    if png_dir is not None:
        from aot_partition.report.memory_plot import write_memory_timeline_png

        write_memory_timeline_png(with_ws, os.path.join(png_dir, f"memory_{joint.label}.png"),
                                  title=f"{joint.label}, budget {budget}")
    return Row(joint.label, len(joint.module.graph.nodes), budget, device, with_ws.saved_bytes,
               plain.peak_above_baseline, with_ws.peak_above_baseline, measured.peak_bytes,
               _error(plain.peak_above_baseline, measured.peak_bytes),
               _error(with_ws.peak_above_baseline, measured.peak_bytes),
               f"{with_ws.peak_phase}:{with_ws.peak_node}", simulate_s, measure_s)


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        "## Memory model: simulated vs measured peak of one training step",
        "",
        f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['date']}; device "
        f"{meta['device']}, {meta['dtype']}. Peaks in bytes above the step's inputs; "
        "error = (simulated - measured) / measured.",
        "",
        "| model | nodes | budget | saved bytes | simulated (fx) | simulated (+workspace) | "
        "measured | error fx % | error +ws % | peak at | simulate s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.model} | {r.nodes} | {r.budget} | {r.saved_bytes:,} | "
                     f"{r.simulated:,} | {r.simulated_workspace:,} | {r.measured:,} | "
                     f"{r.error_pct:+.1f} | {r.error_workspace_pct:+.1f} | {r.peak_at} | "
                     f"{r.simulate_s:.3f} |")
    worst = max((abs(r.error_workspace_pct) for r in rows), default=0.0)
    worst_fx = max((abs(r.error_pct) for r in rows), default=0.0)
    lines += ["", f"Largest |error|: {worst_fx:.1f}% (fx level), {worst:.1f}% with workspaces."]
    return "\n".join(lines) + "\n"


def _progress(items: list[Any], desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="two tiny models, budget 0.5")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    known = [*ZOO, *EXTRA, *GPU_EXTRA]
    parser.add_argument("--models", help=f"comma-separated subset of {', '.join(known)} "
                        f"(default: all; {', '.join(GPU_EXTRA)} only on CUDA)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    default = [*ZOO, *EXTRA, *(GPU_EXTRA if args.device.startswith("cuda") else ())]
    labels = list(SMOKE) if args.smoke else [m for m in (args.models or ",".join(default))
                                             .split(",") if m]
    budgets = (0.5,) if args.smoke else BUDGETS
    unknown = set(labels) - set(known)
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    jobs = [(label, b) for label in labels for b in budgets]
    joints: dict[str, Joint] = {}
    rows = []
    for label, budget in _progress(jobs, "memory model"):
        if label not in joints:
            joints[label] = capture(label, args.device, DTYPES[args.dtype])
        png = args.out if budget == budgets[0] else None
        rows.append(run_case(joints[label], budget, args.device, png))
    meta = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch threads "
                   f"{torch.get_num_threads()}",
        "torch": torch.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    report = markdown(rows, meta)
    with open(os.path.join(args.out, "memory_model_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
    with open(os.path.join(args.out, "memory_model_bench.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
