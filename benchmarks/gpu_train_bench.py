"""Training steps on a GPU: eager, ``backend="inductor"``, ours, and both compiled autograds.

Each (model, variant) pair runs in its own process, so no variant inherits another's compiled
kernels, caches or allocator state; every process starts with an empty
``TORCHINDUCTOR_CACHE_DIR`` unless ``--warm-restart`` asks for a second, warm process.

Variants:

- ``eager``;
- ``inductor@B``: ``torch.compile(backend="inductor")`` with torch's
  ``activation_memory_budget`` B (1.0 and 0.5);
- ``ours@B``: ``aot_pipeline.compile(memory_budget=B)`` (1.0, 0.5 and 0.2); ``B`` may also be
  a size (``ours@1500MiB``, a cap on saved activation bytes). Partitioner flags follow after
  ``+``: ``ours@0.3+est=roofline+solver=ilp_graph+peak=1800MiB`` patches
  ``aot_config.functorch``'s runtime estimator, knapsack solver and simulated-peak cap
  (``activation_memory_peak_bytes``) for the whole run;
- ``aot_pipeline@B`` (not run by default; the warm restart uses it):
  ``torch.compile(backend="aot_pipeline", options={"memory_budget": B})``, which keeps
  Inductor's FX graph and AOTAutograd caches on;
- ``torch_ca``: forward compiled by Inductor, the backward captured by torch's compiled
  autograd and compiled by Inductor;
- ``ours_ca``: ``aot_pipeline.compile(compiled_autograd=True)``, the backward captured by our
  compiled autograd and compiled by Inductor.

Models (``--size full``): ``gpt2``, the built-in GPT at GPT-2 size (d 768, 12 layers, 12 heads,
vocab 50304, seq 1024, batch 8, SDPA); ``llama``, a transformers ``LlamaForCausalLM`` (d 1024,
8 layers, 16 heads, 4 KV heads, seq 1024, batch 8, SDPA). bf16 on CUDA, fp32 on CPU.
``--size tiny`` shrinks both for the CPU smoke test.

``+peakfrac=F`` caps the modelled peak at a share F of the uncapped peak
(``activation_memory_peak_fraction``).

Each row: first-step seconds (compile included), median step ms, peak step memory above what was
allocated before the step (CUDA: ``max_memory_allocated``; CPU: the profiler's allocation events
of one more step), for our variants the peak the compiled-program memory model predicted from
the partition (``aot_partition.memory_models.inductor``), the largest relative difference of
the step losses from eager's, and the captures counted by compiled autograd.

    uv run python benchmarks/gpu_train_bench.py --device cuda            # all, one table
    uv run python benchmarks/gpu_train_bench.py --device cpu --size tiny --steps 2
    # the warm restart (CPU target): later processes on the first one's Inductor cache
    uv run python benchmarks/gpu_train_bench.py --device cpu --size tiny --models gpt2 \
        --variants inductor@1.0,aot_pipeline@1.0 --warm-restart
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("gpt2", "llama")
VARIANTS = ("eager", "inductor@1.0", "inductor@0.5", "ours@1.0", "ours@0.5", "ours@0.2",
            "torch_ca", "ours_ca")
# ``torch.compile(backend="aot_pipeline")``: what the warm restart compares with Inductor
# (``aot_pipeline.compile`` keeps the FX graph cache off to see every partition).
BACKEND_VARIANTS = ("aot_pipeline@1.0", "aot_pipeline@0.5")
VALID_VARIANTS = VARIANTS + BACKEND_VARIANTS
# ``ours@B+key=value``: what each key patches in ``aot_config.functorch``.
OURS_FLAGS = {"est": "activation_memory_budget_runtime_estimator",
              "solver": "activation_memory_budget_solver",
              "peak": "activation_memory_peak_bytes",
              "peakfrac": "activation_memory_peak_fraction"}
WARM_RESTART_VARIANTS = ("inductor@1.0", "aot_pipeline@1.0")
# Largest relative loss difference from eager still called agreement (bf16 on CUDA, fp32 on CPU).
LOSS_RTOL = {"cuda": 2e-2, "cpu": 1e-3}

SIZES: dict[str, dict[str, dict[str, int]]] = {
    "full": {"gpt2": dict(vocab=50304, dim=768, heads=12, layers=12, seq=1024, batch=8),
             "llama": dict(vocab=32000, dim=1024, heads=16, kv_heads=4, layers=8, hidden=2816,
                           seq=1024, batch=8)},
    "tiny": {"gpt2": dict(vocab=128, dim=32, heads=4, layers=2, seq=16, batch=2),
             "llama": dict(vocab=128, dim=32, heads=4, kv_heads=2, layers=2, hidden=64, seq=16,
                           batch=2)},
}


# --------------------------------------------------------------------------- one variant ----

def build(model_name: str, size: dict[str, int], device: Any, dtype: Any) -> Any:
    """The model wrapped so that ``module(idx, targets)`` returns the scalar loss."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    if model_name == "gpt2":
        from aot_pipeline.models import GPT

        net = GPT(vocab=size["vocab"], dim=size["dim"], heads=size["heads"],
                  layers=size["layers"], seq=size["seq"], sdpa=True)

        class WithLoss(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                logits = self.net(idx)
                return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=size["vocab"], hidden_size=size["dim"], intermediate_size=size["hidden"],
            num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
            num_key_value_heads=size["kv_heads"], max_position_embeddings=size["seq"],
            attn_implementation="sdpa", use_cache=False)
        net = LlamaForCausalLM(config)

        class WithLoss(nn.Module):  # type: ignore[no-redef]
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                logits = self.net(input_ids=idx).logits
                return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    return WithLoss().to(device=device, dtype=dtype)


def batches(size: dict[str, int], count: int, device: Any) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, size["vocab"], (size["batch"], size["seq"] + 1),
                               generator=generator)
        out.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))
    return out


class Variant:
    """How one variant calls the model and runs its backward."""

    def __init__(self, name: str, module: Any) -> None:
        import torch

        self.name = name
        self.backward: Callable[[Any], None] = lambda loss: loss.backward()
        self.patch: contextlib.AbstractContextManager = contextlib.nullcontext()
        self.captures: Callable[[], int | None] = lambda: None
        # Our variants: each partition as the partitioner returned it (the model's input).
        self.partitions: list[tuple[Any, Any]] = []
        if name == "eager":
            self.call = module
        elif name.startswith("inductor@"):
            from torch._functorch import config as torch_functorch_config

            budget = float(name.split("@")[1])
            # Read when the backward is compiled too (lazily, at the first backward): the
            # whole loop runs inside the patch.
            self.patch = torch_functorch_config.patch(activation_memory_budget=budget)
            self.call = torch.compile(module, backend="inductor")
        elif name.startswith("ours@"):
            import aot_pipeline
            from aot_config import functorch as functorch_flags

            budget, flags = parse_ours_variant(name)
            # Read when each graph is partitioned (the backward's too): the loop runs inside.
            self.patch = functorch_flags.patch(**flags)
            self.call = aot_pipeline.compile(module, memory_budget=budget,
                                             solver=flags.get(OURS_FLAGS["solver"], "dp"))
            self.partitions = _keep_partitions(self.call.recorder)
        elif name.startswith("aot_pipeline@"):
            import aot_pipeline  # noqa: F401 - registers the back end

            self.call = torch.compile(module, backend="aot_pipeline",
                                      options={"memory_budget": float(name.split("@")[1])})
        elif name == "torch_ca":
            from torch._dynamo import compiled_autograd as torch_compiled_autograd
            from torch._dynamo.utils import counters

            self.call = torch.compile(module, backend="inductor")

            def compiler(graph: Any) -> Any:
                return torch.compile(graph, backend="inductor", fullgraph=True)

            def backward(loss: Any) -> None:
                with torch_compiled_autograd._enable(compiler):
                    loss.backward()

            self.backward = backward
            self.captures = lambda: int(counters["compiled_autograd"]["captures"])
        elif name == "ours_ca":
            import aot_pipeline
            import compiled_autograd

            compiled = aot_pipeline.compile(module, compiled_autograd=True)
            self.call = compiled
            self.backward = compiled.backward
            self.captures = lambda: int(compiled_autograd.counters()["captures"])
        else:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(VALID_VARIANTS)}")


def _keep_partitions(recorder: Any) -> list[tuple[Any, Any]]:
    """A deep copy of each (forward, backward) our partitioner returns, before Inductor's
    passes rewrite them: what the compiled-program memory model predicts from."""
    import copy

    kept: list[tuple[Any, Any]] = []
    record = recorder.record_forward

    def keep(forward: Any, backward: Any = None, *args: Any, **kwargs: Any) -> None:
        kept.append((copy.deepcopy(forward), copy.deepcopy(backward)))
        record(forward, backward, *args, **kwargs)

    recorder.record_forward = keep
    return kept


def predicted_peak(partitions: list[tuple[Any, Any]], device: Any) -> int | None:
    """The Inductor memory model's step peak above the inputs (one graph only), in the CUDA
    caching allocator's blocks on CUDA."""
    if len(partitions) != 1:
        return None
    from aot_partition.memory_models.inductor import simulate_compiled_partition

    allocator = "cuda" if device.type == "cuda" else None
    return simulate_compiled_partition(*partitions[0], allocator=allocator).peak_above_baseline


def _unreachable_cap(error: BaseException) -> Any:
    """The UnreachableMemoryBudgetError a failed compile wraps, or None."""
    from aot_partition import UnreachableMemoryBudgetError

    sys.path.insert(0, HERE)
    try:
        from compiled_memory_bench import unreachable_in
    finally:
        sys.path.remove(HERE)
    return unreachable_in(error, UnreachableMemoryBudgetError)


def parse_ours_variant(name: str) -> tuple[float | str, dict[str, Any]]:
    """``ours@B+key=value...`` -> (``aot_pipeline.compile``'s memory budget, the
    ``aot_config.functorch`` flags to patch). A peak cap (``peak``, ``peakfrac``) becomes the
    budget itself (``"6GiB peak"``, ``"0.8 peak"``): the pipeline sets the partitioner's
    peak flags from its budget, so a patched flag would be overridden."""
    from aot_pipeline.options import parse_byte_size, parse_memory_budget

    head, *pairs = name.split("+")
    budget_text = head.split("@", 1)[1]
    fraction, nbytes = parse_memory_budget(budget_text)
    budget: float | str = budget_text if nbytes is not None else fraction
    flags: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in OURS_FLAGS:
            raise ValueError(f"{pair!r} is not key=value with a key from "
                             f"{', '.join(OURS_FLAGS)}")
        if key in ("peak", "peakfrac"):
            if budget != 1.0:
                raise ValueError(f"{pair!r}: a peak cap is the whole budget; write ours@1.0+{pair}")
            if key == "peak":
                budget = f"{parse_byte_size(value)} peak"
            else:
                share = float(value)
                if not 0.0 < share <= 1.0:
                    raise ValueError(f"peakfrac={value}: a share of the uncapped peak in (0, 1]")
                budget = f"{share} peak"
        else:
            flags[OURS_FLAGS[key]] = value
    return budget, flags


def is_valid_variant(name: str) -> bool:
    return name in VALID_VARIANTS or name.startswith("ours@")


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.model`` as ``args.variant`` in this process and measure it."""
    import torch

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = SIZES[args.size][args.model]
    module = build(args.model, size, device, dtype)
    # The compile call is timed with the first step: where a back end imports its compiler
    # (at the call, or with the first graph) does not change the sum.
    started = time.perf_counter()
    variant = Variant(args.variant, module)
    compile_call_s = time.perf_counter() - started
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    data = batches(size, args.warmup + args.steps, device)
    losses: list[float] = []
    times: list[float] = []
    peaks: list[int] = []

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with variant.patch:
        for step, (idx, targets) in enumerate(data):
            sync()
            before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            try:
                loss = variant.call(idx, targets)
                variant.backward(loss)
            except Exception as error:  # a cap no cut reaches fails the compile, aloud
                unreachable = _unreachable_cap(error)
                if unreachable is None:
                    raise
                return {"model": args.model, "variant": args.variant,
                        "error": f"unreachable: least peak {unreachable.least / 2**20:.1f} MiB",
                        "unreachable": True, "least_peak_bytes": unreachable.least}
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
            if device.type == "cuda" and step >= args.warmup:
                peaks.append(torch.cuda.max_memory_allocated(device) - before)
    timed = times[args.warmup:] or times
    if device.type != "cuda":  # the CPU's peak: the profiler's allocation events, one step
        from aot_partition.memory_models.simulator import measure_peak

        idx, targets = data[-1]
        with variant.patch:
            peaks.append(measure_peak(lambda: variant.backward(variant.call(idx, targets)),
                                      device).peak_bytes)
        optimizer.zero_grad(set_to_none=True)
    return {"model": args.model, "variant": args.variant, "first_step_s": compile_call_s + times[0],
            "predicted_peak_bytes": predicted_peak(variant.partitions, device),
            "compile_call_s": compile_call_s,
            "median_ms": 1e3 * statistics.median(timed), "min_ms": 1e3 * min(timed),
            "peak_step_bytes": max(peaks) if peaks else None, "losses": losses,
            "captures": variant.captures(), "steps": len(timed), "warmup": args.warmup}


# ------------------------------------------------------------------------- orchestration ----

def child_command(args: argparse.Namespace, model: str, variant: str, out: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--child", "--model", model,
            "--variant", variant, "--device", args.device, "--size", args.size,
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--json", out]


def run_child(args: argparse.Namespace, model: str, variant: str, cache_dir: str) -> dict:
    """One (model, variant) in a fresh process with ``cache_dir`` as Inductor's cache."""
    os.makedirs(cache_dir, exist_ok=True)
    from aot_pipeline.train import cold_cache_environment

    env = dict(os.environ, **cold_cache_environment(cache_dir), PYTHONUNBUFFERED="1")
    out = cache_dir + ".json"
    try:
        completed = subprocess.run(child_command(args, model, variant, out), env=env,
                                   timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:  # one slow variant must not cost the rows after it
        return {"model": model, "variant": variant, "error": f"over {args.timeout:.0f} s"}
    if completed.returncode != 0:
        return {"model": model, "variant": variant, "error": f"exit {completed.returncode}"}
    with open(out) as f:
        return json.load(f)


def compare_losses(rows: list[dict], rtol: float) -> None:
    """Mark each row with its largest relative loss difference from the same model's eager."""
    eager = {r["model"]: r["losses"] for r in rows if r["variant"] == "eager" and "losses" in r}
    for row in rows:
        reference = eager.get(row["model"])
        if reference is None or "losses" not in row:
            continue
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(row["losses"], reference))
        row["loss_max_rel_diff"] = diff
        row["loss_agrees"] = diff <= rtol and len(row["losses"]) == len(reference)


def metadata(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    return {"device": device_name, "torch": torch.__version__,
            "python": platform.python_version(), "size": args.size,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "steps": args.steps, "warmup": args.warmup}


def render(meta: dict, rows: list[dict], warm: list[dict]) -> str:
    lines = [f"Device: {meta['device']}; torch {meta['torch']}, Python {meta['python']}; "
             f"{meta['date']}. Sizes: {meta['size']}; median of {meta['steps']} steps after "
             f"{meta['warmup']} warm-up steps; each variant in its own process, cold caches.", "",
             "| model | variant | first step s | median ms | peak step MiB | predicted MiB "
             "| loss max rel diff | captures |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | {r['error']} | | | | | |")
            continue
        peak = f"{r['peak_step_bytes'] / 2**20:.1f}" if r.get("peak_step_bytes") else "-"
        predicted = (f"{r['predicted_peak_bytes'] / 2**20:.1f}"
                     if r.get("predicted_peak_bytes") else "-")
        diff = f"{r['loss_max_rel_diff']:.1e}" if "loss_max_rel_diff" in r else "-"
        mark = "" if r.get("loss_agrees", True) else " (disagrees)"
        captures = "-" if r.get("captures") is None else str(r["captures"])
        lines.append(f"| {r['model']} | {r['variant']} | {r['first_step_s']:.1f} | "
                     f"{r['median_ms']:.2f} | {peak} | {predicted} | {diff}{mark} | {captures} |")
    if warm:
        lines += ["", "Warm restart: a second process with the first one's Inductor cache "
                  "(FX graph and AOTAutograd caches).", "",
                  "| model | variant | cold first step s | warm first step s (median) | samples |",
                  "|---|---|---:|---:|---|"]
        lines += [f"| {w['model']} | {w['variant']} | {w['cold_first_step_s']:.2f} | "
                  f"{w['warm_first_step_s']:.2f} | "
                  + ", ".join(f"{x:.2f}" for x in w["warm_samples_s"]) + " |" for w in warm]
    return "\n".join(lines) + "\n"


def write_outputs(args: argparse.Namespace, rows: list[dict], warm: list[dict]) -> str:
    """Compare the losses, write the JSON and Markdown tables, return the Markdown."""
    compare_losses(rows, LOSS_RTOL[args.device])
    meta = metadata(args)
    markdown = render(meta, rows, warm)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_train_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "warm_restart": warm}, f, indent=2)
    with open(os.path.join(args.out, "gpu_train_bench.md"), "w") as f:
        f.write(markdown)
    return markdown


def progress(items: list, label: str) -> Iterator:
    try:
        from tqdm import tqdm
    except ImportError:  # the device machine may lack it; plain iteration then
        yield from items
        return
    yield from tqdm(items, desc=label, unit="run", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=tuple(SIZES), default="full")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {', '.join(VALID_VARIANTS)}")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument("--warm-restart", action="store_true",
                        help=f"also run {', '.join(WARM_RESTART_VARIANTS)} a second time on "
                             "the first run's cache and report the warm first step")
    parser.add_argument("--warm-runs", type=int, default=3,
                        help="warm processes per variant; the table shows their median")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.child:
        with open(args.json, "w") as f:
            json.dump(run_variant(args), f)
        return
    models = [m for m in args.models.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    unknown_models = sorted(set(models) - set(MODELS))
    if unknown_models:
        parser.error(f"unknown models {unknown_models}; valid: {', '.join(MODELS)}")
    unknown = [v for v in variants if not is_valid_variant(v)]
    if unknown:
        parser.error(f"unknown variants {unknown}; valid: {', '.join(VALID_VARIANTS)}, "
                     "or ours@B+key=value...")
    for variant in variants:
        if variant.startswith("ours@"):
            try:
                parse_ours_variant(variant)
            except ValueError as exc:
                parser.error(f"variant {variant!r}: {exc}")
    rows, warm = [], []
    pairs = [(m, v) for m in models for v in variants]
    with tempfile.TemporaryDirectory(prefix="gpu-train-bench-") as scratch:
        for index, (model, variant) in enumerate(progress(pairs, "variants")):
            cache_dir = os.path.join(scratch, f"{index}")
            row = run_child(args, model, variant, cache_dir)
            rows.append(row)
            write_outputs(args, rows, warm)  # what ran so far survives an interrupted run
            if args.warm_restart and variant in WARM_RESTART_VARIANTS and "error" not in row:
                again = [run_child(args, model, variant, cache_dir) for _ in range(args.warm_runs)]
                seconds = [r["first_step_s"] for r in again if "error" not in r]
                if seconds:
                    warm.append({"model": model, "variant": variant,
                                 "cold_first_step_s": row["first_step_s"],
                                 "warm_first_step_s": statistics.median(seconds),
                                 "warm_samples_s": seconds})
    print(write_outputs(args, rows, warm))
    # An unreachable cap is an answer (the compile failed aloud, naming the least peak).
    failed = [r for r in rows if ("error" in r and not r.get("unreachable"))
              or r.get("loss_agrees") is False]
    if failed:
        raise SystemExit(f"{len(failed)} runs failed or disagree with eager: "
                         + ", ".join(f"{r['model']}/{r['variant']}" for r in failed))


if __name__ == "__main__":
    main()
