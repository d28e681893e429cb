"""Split at GPU sizes, simulated: the LM head and its loss in chunks against budgets alone.

SIMULATED, not measured: each step is traced on fake tensors (bf16 weights, the loss in fp32,
nothing computed), partitioned, and scored by

- peak: the compiled-program memory model (``aot_partition.memory_models.inductor``), Inductor's
  lowering for CPU (a GPU's Triton lowering needs a GPU), library scratch not measured, the
  split ops' scratch from their shapes; MiB above the step's inputs;
- step time: the roofline estimate (``aot_partition.costs.roofline``) with an H100's numbers
  summed over the forward and backward graphs (the split ops priced with their passes over
  each chunk's logits and the weight-sized traffic every chunk repeats).

Rows: ``inductor@1.0`` (torch's partitioner), ``torch@0.5``, ``torch@0.0``, ``ours@0.5``,
with ``--baselines N`` the hand-chunked baselines of ``split_bench.py`` (torchtune-style,
liger-style) in N chunks under torch's partitioner at 1.0 and 0.5,
``ours split=N`` at budget 1.0 (gradients made in the forward) and at 0.5, and with
``--cap-share`` the partitioner's cut under a peak cap (the N whose 0.5 row is fastest).
Models: GPT-2 size (vocab 50,304, d 768, 12 layers, 8 x 1024 tokens), Llama-style (d 1024,
4 layers, SwiGLU 2816, unfused attention, 2 x 2048 tokens) with vocab 32,000 and 128,256, and with vocab 32,000 and
attention through scaled_dot_product_attention (``llama-32k-sdpa``; ``llama-128k-sdpa`` on
request).

    uv run python benchmarks/split_sim_bench.py --results      # writes RESULTS-split-sim.md
    uv run python benchmarks/split_sim_bench.py --smoke        # a small GPT, 3 rows
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2**20

MODELS: dict[str, tuple[str, dict[str, Any], int]] = {
    "gpt2-size": ("GPT", {"vocab": 50304, "dim": 768, "heads": 12, "layers": 12, "seq": 1024,
                          "sdpa": True}, 8),
    "llama-32k": ("Llama", {"vocab": 32000, "dim": 1024, "heads": 16, "layers": 4, "seq": 2048,
                            "hidden": 2816}, 2),
    "llama-128k": ("Llama", {"vocab": 128256, "dim": 1024, "heads": 16, "layers": 4,
                             "seq": 2048, "hidden": 2816}, 2),
    # The same with attention through scaled_dot_product_attention, as Llamas are trained:
    # without the score matrices the layers' peak drops and the head's shows.
    "llama-32k-sdpa": ("Llama", {"vocab": 32000, "dim": 1024, "heads": 16, "layers": 4,
                                 "seq": 2048, "hidden": 2816, "sdpa": True}, 2),
    "llama-128k-sdpa": ("Llama", {"vocab": 128256, "dim": 1024, "heads": 16, "layers": 4,
                                  "seq": 2048, "hidden": 2816, "sdpa": True}, 2),
}
DEFAULT_MODELS = ("gpt2-size", "llama-32k", "llama-128k", "llama-32k-sdpa")
SMOKE = {"gpt-small": ("GPT", {"vocab": 4096, "dim": 64, "heads": 4, "layers": 2, "seq": 128,
                               "sdpa": True}, 2)}
CHUNKS = (2, 4, 8, 16)


@dataclass
class Row:
    model: str
    variant: str
    peak_mib: float
    step_ms: float
    seconds: float  # to trace, partition and price


def _hidden(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The built-in GPT's or Llama's forward without the head."""
    x = module.tok(ids)
    if hasattr(module, "pos"):
        x = x + module.pos[: ids.shape[1]]
    for block in module.blocks:
        x = block(x)
    return (module.ln if hasattr(module, "ln") else module.norm)(x)


def trace(kind: str, spec: dict[str, Any], batch: int, chunks: int | None,
          sdpa: bool = False, style: str = "split"
          ) -> tuple[fx.GraphModule, list[Any], int, list[int]]:
    """The step's joint (loss in fp32 inside), traced on fake CPU tensors in bf16; ``sdpa``:
    every attention through scaled_dot_product_attention (a Llama as trained). With
    ``chunks``, the head and loss in that many chunks: ``style`` "split" (our chunked op),
    "torchtune" or "liger" (the hand-chunked baselines of split_bench.py, in plain ops)."""
    from aot_partition.split import chunked_loss  # noqa: F401 - registers the ops
    from aot_pipeline import models
    from functorch.compile import aot_function, default_partition, make_boxed_func
    from split_bench import liger_loss, torchtune_loss
    from torch._subclasses.fake_tensor import FakeTensorMode

    record: dict[str, Any] = {}

    def recording(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  **kwargs: Any) -> Any:
        record["joint"] = (copy.deepcopy(joint), joint_inputs, num_fwd_outputs)
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def boxed(gm: fx.GraphModule, _inputs: Any) -> Any:
        return make_boxed_func(gm)

    if kind == "Llama" and spec.get("sdpa"):  # a Llama's attention is switched after building
        spec = {k: v for k, v in spec.items() if k != "sdpa"}
        sdpa = True
    default_dtype = torch.get_default_dtype()
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.set_default_dtype(torch.bfloat16)
        try:
            module = getattr(models, kind)(**spec)
        finally:
            torch.set_default_dtype(default_dtype)
        for block in module.blocks if sdpa else ():
            block.attn.sdpa = True
        params = dict(module.named_parameters())
        ids = torch.randint(0, spec["vocab"], (batch, spec["seq"]))
        labels = torch.randint(0, spec["vocab"], (batch, spec["seq"]))

        def step(params: dict[str, torch.Tensor], ids: torch.Tensor, labels: torch.Tensor
                 ) -> torch.Tensor:
            head_w = params["head.weight"]
            head_b = params.get("head.bias")
            h = _functional_hidden(module, params, ids)
            if chunks is None:
                logits = F.linear(h, head_w, head_b).float()
                return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            if style in BASELINES:
                return BASELINES[style](h.flatten(0, 1), head_w, head_b, labels.flatten(),
                                        chunks)
            return torch.ops.aot_partition.linear_cross_entropy_with_grads(
                h.flatten(0, 1), head_w, head_b, labels.flatten(), -100, "mean", 0.0,
                "float32", chunks)[0]

        BASELINES = {"torchtune": torchtune_loss, "liger": liger_loss}
        aot_function(step, fw_compiler=boxed, bw_compiler=boxed,
                     partition_fn=recording)(params, ids, labels)
    joint, inputs, num_fwd_outputs = record["joint"]
    return joint, inputs, num_fwd_outputs, list(range(len(params)))


def _functional_hidden(module: torch.nn.Module, params: dict[str, torch.Tensor],
                       ids: torch.Tensor) -> torch.Tensor:
    from torch.nn.utils.stateless import _reparametrize_module

    with _reparametrize_module(module, params):
        return _hidden(module, ids)


def partition(joint: fx.GraphModule, inputs: list[Any], num_fwd_outputs: int,
              static: list[int], who: str, fraction: float, peak_cap: int | None = None
              ) -> tuple[Any, Any]:
    from aot_config import functorch as functorch_config
    from aot_partition import min_cut_rematerialization_partition
    from torch._functorch import config as torch_config
    from torch._functorch.partitioners import (
        min_cut_rematerialization_partition as torch_partition,
    )

    module = copy.deepcopy(joint)
    if who == "torch":
        with torch_config.patch(activation_memory_budget=fraction):
            return torch_partition(module, inputs, num_fwd_outputs=num_fwd_outputs,
                                   static_lifetime_input_indices=static)
    cap = {} if peak_cap is None else {
        "activation_memory_peak_bytes": peak_cap, "activation_memory_model": "inductor",
        "activation_memory_budget_best_effort": True}
    with functorch_config.patch(activation_memory_budget=fraction, **cap):
        return min_cut_rematerialization_partition(module, inputs,
                                                   num_fwd_outputs=num_fwd_outputs,
                                                   static_lifetime_input_indices=static)


def score(fw: Any, bw: Any, static: list[int], baseline: list[int] | None = None
          ) -> tuple[float, float]:
    from aot_partition.costs.estimators import estimate_runtime
    from aot_partition.memory_models.inductor import simulate_compiled_partition

    timeline = simulate_compiled_partition(copy.deepcopy(fw), copy.deepcopy(bw),
                                           static_input_indices=static, workspace=False)
    seconds = sum(estimate_runtime(n, "roofline") for g in (fw.graph, bw.graph)
                  for n in g.nodes if n.op == "call_function")
    if baseline is not None:
        baseline.append(timeline.baseline_bytes)
    return timeline.peak_above_baseline / MIB, seconds * 1e3


def baseline_rows(name: str, kind: str, spec: dict[str, Any], batch: int,
                  chunks: int) -> list[Row]:
    """The hand-chunked baselines as a user compiling them with Inductor runs them: torch's
    partitioner at budget 1.0 (the default) and at 0.5."""
    rows = []
    for style in ("torchtune", "liger"):
        joint = trace(kind, spec, batch, chunks, style=style)
        for fraction in (1.0, 0.5):
            start = time.perf_counter()
            peak, ms = score(*partition(*joint, "torch", fraction), joint[3])
            rows.append(Row(name, f"{style}-style {chunks}, torch@{fraction}", peak, ms,
                            time.perf_counter() - start))
            print(rows[-1], file=sys.stderr)
    return rows


def run_model(name: str, kind: str, spec: dict[str, Any], batch: int,
              chunks: tuple[int, ...], cap_share: float | None = None,
              baselines: int | None = None, only_baselines: bool = False) -> list[Row]:
    rows = []
    whole = trace(kind, spec, batch, None)
    baseline: list[int] = []
    for variant, who, fraction in (("inductor@1.0", "torch", 1.0), ("torch@0.5", "torch", 0.5),
                                   ("torch@0.0", "torch", 0.0), ("ours@0.5", "ours", 0.5)):
        start = time.perf_counter()
        peak, ms = score(*partition(*whole, who, fraction), whole[3], baseline)
        rows.append(Row(name, variant, peak, ms, time.perf_counter() - start))
        print(rows[-1], file=sys.stderr)
    if baselines:
        rows += baseline_rows(name, kind, spec, batch, baselines)
    if only_baselines:
        return rows
    at_half: dict[int, tuple[Any, Row]] = {}
    for k in chunks:
        start = time.perf_counter()
        split = trace(kind, spec, batch, k)
        peak, ms = score(*partition(*split, "ours", 1.0), split[3])
        rows.append(Row(name, f"ours split={k}", peak, ms, time.perf_counter() - start))
        print(rows[-1], file=sys.stderr)
        # the split and a budget together: the layers' activations too
        start = time.perf_counter()
        peak, ms = score(*partition(*split, "ours", 0.5), split[3])
        at_half[k] = (split, Row(name, f"ours split={k} @0.5", peak, ms,
                                 time.perf_counter() - start))
        print(at_half[k][1], file=sys.stderr)
    rows += [row for _, row in at_half.values()]
    if cap_share:  # the planner's own choice under a peak cap (Inductor-priced), with the
        # chunk count whose split at 0.5 ran the shortest estimated step
        k, (split, _) = min(at_half.items(), key=lambda item: item[1][1].step_ms)
        half = next(r for r in rows if r.variant == "torch@0.5")
        cap = baseline[0] + int(cap_share * half.peak_mib * MIB)
        start = time.perf_counter()
        peak, ms = score(*partition(*split, "ours", 1.0, peak_cap=cap), split[3])
        rows.append(Row(name, f"ours split={k}, cap {cap_share:.0%} of torch@0.5",
                        peak, ms, time.perf_counter() - start))
        print(rows[-1], file=sys.stderr)
    return rows


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = ["## Split at GPU sizes, SIMULATED (H100 roofline, Inductor's CPU lowering)", "",
             f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['date']}. Not measured: "
             "see the module doc of `benchmarks/split_sim_bench.py` for what the model counts. "
             "Peak: MiB above the step's inputs; step: the roofline estimate on an H100.", "",
             "| model | variant | peak MiB | vs inductor@1.0 | vs torch@0.5 | step ms (est.) "
             "| vs inductor@1.0 |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = next(x for x in rows if x.model == r.model and x.variant == "inductor@1.0")
        half = next(x for x in rows if x.model == r.model and x.variant == "torch@0.5")
        lines.append(f"| {r.model} | {r.variant} | {r.peak_mib:.0f} | "
                     f"{100 * (r.peak_mib / base.peak_mib - 1):+.1f}% | "
                     f"{100 * (r.peak_mib / half.peak_mib - 1):+.1f}% | {r.step_ms:.2f} | "
                     f"{100 * (r.step_ms / base.step_ms - 1):+.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true")
    parser.add_argument("--cap-share", type=float, default=None,
                        help="also the split under a peak cap at this share of torch@0.5's "
                             "peak, the planner choosing the cut (Inductor-priced: slow)")
    parser.add_argument("--baselines", type=int, default=None, metavar="CHUNKS",
                        help="also the hand-chunked baselines (torchtune-style, liger-style) "
                             "in this many chunks, partitioned by torch at 1.0 and 0.5")
    parser.add_argument("--only-baselines", action="store_true",
                        help="with --baselines: the reference rows and the baselines only")
    args = parser.parse_args(argv)
    from aot_partition.costs import roofline

    roofline.set_device_numbers("cpu", roofline.lookup("H100"))
    models = SMOKE if args.smoke else {m: MODELS[m] for m in args.models.split(",") if m}
    chunks = (4,) if args.smoke else CHUNKS
    rows: list[Row] = []
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    os.makedirs(args.out, exist_ok=True)
    for name, (kind, spec, batch) in models.items():
        rows += run_model(name, kind, spec, batch, chunks, args.cap_share, args.baselines,
                          args.only_baselines)
        text = markdown(rows, meta)
        with open(os.path.join(args.out, "split_sim_bench.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "split_sim_bench.json"), "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=2)
    print(text)
    if args.results:
        with open(os.path.join(HERE, "RESULTS-split-sim.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
