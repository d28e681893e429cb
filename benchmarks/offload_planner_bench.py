"""The keep / recompute / offload planner against torch's partitioner, simulated (issue 29).

Models are traced on fake CPU tensors in bf16 (nothing is computed, the sizes are real) and
every decision and score uses the H100 SXM row of the roofline table (``costs/roofline.py``) and
a 50 GB/s host link: "simulated, H100 table". For each model, one joint graph is split by:

- eager: the default split (save what the backward reads, recompute nothing);
- torch's min-cut partitioner at activation_memory_budget 1.0 and 0.5;
- ours (min_cut_rematerialization_partition) at 1.0, 0.5 and 0.4;
- the planner (budget/offload_plan.py) under three caps on the simulated peak.

Scores: step time = roofline seconds of every op of the forward and backward graphs, plus the
planner's copy time not hidden behind compute; peak = the simulated forward+backward peak
(``memory_models/simulator.py``; parameters resident; offloaded values off the device over their window).
Also times the planner's decision on gpt-32 (partition_bench's CPU model). Writes
benchmarks/RESULTS-offload-planner.md and benchmarks/offload_timeline.png.

    uv run python benchmarks/offload_planner_bench.py            # both models, ~3 min
    uv run python benchmarks/offload_planner_bench.py --smoke    # a tiny GPT, seconds
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition
from aot_partition.budget.offload_plan import (
    PeakPlan,
    choose_under_peak,
    peak_candidates,
    plan_activations,
)
from aot_partition.budget.search import BudgetSearch
from aot_partition.costs import roofline
from aot_partition.costs.estimators import estimate_runtime
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.fx.classify import classify
from aot_partition.fx.offload import host_link_bandwidth
from aot_partition.memory_models.simulator import MemoryTimeline, simulate_partition
from aot_pipeline.models import GPT, Llama
from torch._functorch import config as torch_config
from torch._functorch.partitioners import default_partition
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut_partition,
)

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = "H100 SXM"
LINK_GBPS = 50.0
MODELS: dict[str, tuple[type[torch.nn.Module], dict[str, Any], int]] = {
    # GPT-2 size: d 768, 12 layers, seq 1024, batch 8 (issue 29's GPU model).
    "gpt2-size": (GPT, {"vocab": 50304, "dim": 768, "heads": 12, "layers": 12, "seq": 1024,
                        "sdpa": True}, 8),
    # Llama-style (RMSNorm, eager attention, SwiGLU): d 1024, 8 layers, seq 1024, batch 4.
    "llama-style": (Llama, {"vocab": 32000, "dim": 1024, "heads": 16, "layers": 8,
                            "seq": 1024, "hidden": 2816}, 4),
}
SMOKE_MODELS = {"gpt-tiny": (GPT, {"vocab": 512, "dim": 64, "heads": 2, "layers": 2,
                                   "seq": 64, "sdpa": True}, 2)}
# The planner's caps, as fractions of eager's simulated peak.
PEAK_CAPS = (0.8, 0.65, 0.5)


@dataclass
class Joint:
    label: str
    module: fx.GraphModule
    inputs: Any
    num_fwd_outputs: int
    static: list[int]

    def fresh(self) -> fx.GraphModule:
        return copy.deepcopy(self.module)


@dataclass
class Row:
    model: str
    who: str
    step_ms: float
    peak_gib: float
    note: str = ""


def capture_fake(label: str, cls: type[torch.nn.Module], spec: dict[str, Any], batch: int
                 ) -> Joint:
    """The model's joint graph traced on fake bf16 CPU tensors; parameters are static."""
    sys.path.insert(0, HERE)
    from memory_tradeoff_bench import capture_fake_model

    traced, static = capture_fake_model(label, cls, spec, batch)
    return Joint(label, traced.module, traced.inputs, traced.num_fwd_outputs, static)


def _step_seconds(*graphs: fx.Graph) -> float:
    return sum(estimate_runtime(n, "roofline") for g in graphs for n in g.nodes
               if n.op == "call_function")


def _score(joint: Joint, who: str, fw: fx.GraphModule, bw: fx.GraphModule
           ) -> tuple[Row, MemoryTimeline]:
    timeline = simulate_partition(fw.graph, bw.graph, static_input_indices=joint.static)
    return Row(joint.label, who, 1e3 * _step_seconds(fw.graph, bw.graph),
               timeline.peak_bytes / 2**30), timeline


def split(joint: Joint, who: str, fraction: float) -> tuple[fx.GraphModule, fx.GraphModule]:
    module = joint.fresh()
    kwargs = {"num_fwd_outputs": joint.num_fwd_outputs,
              "static_lifetime_input_indices": joint.static}
    if who == "eager":
        return default_partition(module, joint.inputs, **kwargs)
    if who == "torch":
        with torch_config.patch(activation_memory_budget=fraction):
            return torch_min_cut_partition(module, joint.inputs, **kwargs)
    with functorch_config.patch(activation_memory_budget=fraction,
                                activation_memory_budget_runtime_estimator="roofline"):
        return min_cut_rematerialization_partition(module, joint.inputs, **kwargs)


def model_rows(joint: Joint) -> tuple[list[Row], dict[str, MemoryTimeline]]:
    rows: list[Row] = []
    timelines: dict[str, MemoryTimeline] = {}
    for who, fraction in (("eager", 1.0), ("torch", 1.0), ("torch", 0.5), ("ours", 1.0),
                          ("ours", 0.5), ("ours", 0.4)):
        label = who if who == "eager" else f"{who} @{fraction:g}"
        row, timeline = _score(joint, label, *split(joint, who, fraction))
        rows.append(row)
        timelines[label] = timeline
    eager_peak = rows[0].peak_gib * 2**30
    module = joint.fresh()
    info = classify(module, joint.num_fwd_outputs, joint.static)
    search = BudgetSearch.prepare(module.graph, info, solver="dp", estimator="roofline")
    start = time.perf_counter()
    candidates = peak_candidates(search, module, joint.num_fwd_outputs,
                                 static_input_indices=joint.static, bandwidth_gbps=LINK_GBPS)
    seconds = time.perf_counter() - start
    least = min(candidates, key=lambda c: c.peak_bytes)
    for share in PEAK_CAPS:
        cap = int(share * eager_peak)
        label = f"planner, peak <= {cap / 2**30:.2f} GiB ({share:g} x eager)"
        try:
            chosen = choose_under_peak(candidates, cap)
        except UnreachableMemoryBudgetError:
            rows.append(Row(joint.label, label, float("nan"), float("nan"),
                            f"unreachable: least {least.peak_bytes / 2**30:.2f} GiB"))
            continue
        rows.append(_planner_row(joint.label, label, chosen))
        timelines[label] = chosen.timeline
    # Issue 29's targets, on the planner's front: (a) the least peak at torch@0.5's step time;
    # (b) the least peak within 5% of torch@1's step time.
    by_label = {r.who: r for r in rows}
    for label, limit in (("planner at torch @0.5's step", by_label["torch @0.5"].step_ms),
                         ("planner within 1.05 x torch @1's step",
                          1.05 * by_label["torch @1"].step_ms)):
        fast_enough = [c for c in candidates if 1e3 * c.step_s <= limit * (1 + 1e-9)]
        if fast_enough:
            best = min(fast_enough, key=lambda c: (c.peak_bytes, c.step_s))
            rows.append(_planner_row(joint.label, label, best))
            reference = by_label["torch @0.5" if "0.5" in label else "torch @1"]
            rows[-1].note += (f"; peak {100 * (rows[-1].peak_gib / reference.peak_gib - 1):+.1f}%"
                              f" vs {reference.who}")
    rows[-1].note += f" ({len(candidates)} plans built and simulated in {seconds:.0f} s)"
    offloaded = [c for c in candidates if c.plan.offloaded]
    recompute_only = [c for c in candidates if not c.plan.offloaded]
    timelines["least, recompute only"] = min(recompute_only, key=lambda c: c.peak_bytes).timeline
    if offloaded:
        timelines["least, recompute + offload"] = min(
            offloaded, key=lambda c: c.peak_bytes).timeline
    return rows, timelines


def _planner_row(model: str, label: str, chosen: PeakPlan) -> Row:
    plan = chosen.plan
    note = (f"{plan.label}: {len(plan.offloaded)} offloaded "
            f"({plan.offloaded_bytes / 2**30:.2f} GiB), {len(plan.recomputed)} recomputed, "
            f"copies exposed {1e3 * plan.exposed_s:.3f} ms")
    return Row(model, label, 1e3 * chosen.step_s, chosen.peak_bytes / 2**30, note)


def planner_speed(model: str) -> list[str]:
    """The planner's decision time and proven gap on partition_bench's CPU model."""
    sys.path.insert(0, HERE)
    from partition_bench import MODELS as BENCH_MODELS
    from partition_bench import capture_joint

    joint = capture_joint(model, BENCH_MODELS[model])
    info = classify(joint.module, joint.num_fwd_outputs)
    lines = []
    search = BudgetSearch.prepare(joint.module.graph, info, solver="dp", estimator="roofline")
    plan_activations(search, 0.5, offload=False)  # warm: scipy's import, the dp cuts
    for fraction in (0.8, 0.5, 0.2):
        for offload in (True, False):
            search = BudgetSearch.prepare(joint.module.graph, info, solver="dp",
                                          estimator="roofline")
            # timed: the dp incumbent, the fx -> arrays translation, the LP and MILPs
            start = time.perf_counter()
            plan = plan_activations(search, fraction, offload=offload, min_bytes=0)
            seconds = time.perf_counter() - start
            lines.append(f"| {model} | {fraction:g} | {'yes' if offload else 'no'} | "
                         f"{seconds:.2f} | {100 * plan.gap:.2f}% | {plan.source} | "
                         f"{1e6 * plan.runtime:.1f} | {1e6 * (plan.reference_s or 0):.1f} |")
    return lines


def write_png(timelines: dict[str, MemoryTimeline], model: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = {"keep-only (ours @1.0)": timelines["ours @1"],
              "recompute (least peak without offload)": timelines["least, recompute only"]}
    if "least, recompute + offload" in timelines:
        chosen["recompute + offload (least peak)"] = timelines["least, recompute + offload"]
    fig, ax = plt.subplots(figsize=(10, 5))
    for label, timeline in chosen.items():
        steps = timeline.steps
        x = [i / max(len(steps) - 1, 1) for i in range(len(steps))]
        ax.plot(x, [s.high_bytes / 2**30 for s in steps],
                label=f"{label}: peak {timeline.peak_bytes / 2**30:.2f} GiB", linewidth=1.2)
    ax.set_xlabel("fraction of the step's nodes run (forward, then backward)")
    ax.set_ylabel("live GiB (simulated)")
    ax.set_title(f"{model}: memory of one training step (simulated, {DEVICE} table, "
                 f"{LINK_GBPS:g} GB/s host link)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(rows: list[Row], speed: list[str], meta: dict[str, str]) -> str:
    lines = [
        "# Keep / recompute / offload planner (issue 29)", "",
        f"Date {meta['date']}; machine {meta['machine']}; torch {meta['torch']}.", "",
        "Protocol: `uv run python benchmarks/offload_planner_bench.py`. Joint graphs traced on "
        "fake bf16 CPU tensors; every decision and score uses the "
        f"{DEVICE} roofline row and a {LINK_GBPS:g} GB/s host link. Step = roofline ms of all "
        "forward+backward ops (+ copies not hidden); peak = simulated forward+backward peak "
        "(parameters included; offloaded values off the device over their window). The "
        "planner's caps are fractions of eager's peak; the last two planner rows pick, among "
        "the same plans, the least peak at torch @0.5's step time (issue 29 target a) and "
        "within 5% of torch @1's (target b). No optimizer step is modelled; the host link "
        "carries at most one forward's compute time of copies each way.", "",
        "## Simulated, H100 table", "",
        "| model | who | step ms | peak GiB | note |", "|---|---|---:|---:|---|",
    ]
    lines += [f"| {r.model} | {r.who} | {r.step_ms:.2f} | {r.peak_gib:.2f} | {r.note} |"
              for r in rows]
    lines += ["", "## Measured on a GPU", "",
              "Not measured: no GPU lent to this task (issue 29 item 5's GPU rows stay open).", "",
              "## Planner speed (this CPU; the whole decision: dp incumbent, translation, LP, MILPs)", "",
              "| model | fraction | offload | seconds | proven gap | source | runtime us | "
              "dp runtime us |", "|---|---:|---|---:|---:|---|---:|---:|", *speed, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one tiny GPT, no speed run")
    parser.add_argument("--out", default=HERE, help="where the .md and .png go")
    parser.add_argument("--speed-model", default="gpt-32",
                        help="partition_bench model timed for the planner's speed")
    args = parser.parse_args(argv)
    roofline.set_device_numbers("cpu", DEVICE)
    assert host_link_bandwidth(torch.device("cpu"), LINK_GBPS) == LINK_GBPS * 1e9
    models = SMOKE_MODELS if args.smoke else MODELS
    rows: list[Row] = []
    first: tuple[str, dict[str, MemoryTimeline]] | None = None
    for label, (cls, spec, batch) in models.items():
        print(f"{label}: tracing", file=sys.stderr)
        joint = capture_fake(label, cls, spec, batch)
        model_rows_, timelines = model_rows(joint)
        rows += model_rows_
        first = first or (label, timelines)
    roofline.set_device_numbers("cpu", None)
    speed = [] if args.smoke else planner_speed(args.speed_model)
    meta = {"date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores (shared)",
            "torch": torch.__version__}
    name = "RESULTS-offload-planner" + ("-smoke" if args.smoke else "")
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(markdown(rows, speed, meta))
    assert first is not None
    png = "offload_timeline" + ("-smoke" if args.smoke else "") + ".png"
    write_png(first[1], first[0], os.path.join(args.out, png))
    print(markdown(rows, speed, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
