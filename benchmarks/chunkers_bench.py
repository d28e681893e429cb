"""Chunkers: our split against torch's own chunkers, measured (issue 50, items 1 and 3).

One training step (forward, the loss in fp32 inside the compiled region, backward) per variant,
every variant in a fresh subprocess with an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a
new temporary folder, ``TORCHINDUCTOR_FX_GRAPH_CACHE=0``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``),
2 torch threads. Compile: the first step's wall time (tracing, partitioning, Inductor's codegen
and the step itself); step: the median of ``--steps`` (3) steps after it; peak: MiB above the
memory allocated before one more step (``aot_partition.memory_models.simulator.measure_peak``:
the profiler's allocation events on CPU, ``max_memory_allocated`` on CUDA); gradients set to
None before every step. Step CPU: the process's CPU time (both threads) over the same steps,
the median; on a machine shared with other work it moves less than the wall time. Loss: the
first step's; "matches eager" within a relative 1e-5 (fp32 weights) or 4e-3 (bf16 weights: one
bf16 epsilon); grad error: the largest |difference| from eager's gradients over every
parameter.

Variants (``VARIANTS``; ``--variants`` picks by key):

- ``eager``; ``inductor`` (``torch.compile(backend="inductor")``); ``inductor+ac``: the same
  with Inductor's auto_chunker (``torch._inductor.config.auto_chunker.enable``, a joint-graph
  pass, 8 chunks by default);
- ``lce-inductor`` / ``lce-ours``: the loss written as ``F.linear_cross_entropy(hidden, weight,
  target, options=LinearCrossEntropyOptions())`` (torch's token-chunked op, in user code) on
  the model's last hidden states, compiled by Inductor and by ours (``aot_pipeline.compile``);
- ``liger-inductor``: split_bench's Liger-style fused linear cross-entropy (8 chunks, gradients
  in the forward) compiled by Inductor;
- ``split4`` ... ``split64``: ours, ``aot_pipeline.compile(step, split=N)``;
- ``cap-ac``: ours, ``split="auto"`` under ``memory_budget="<bytes> peak"`` with the cap the
  step's inputs plus 0.7 x ``inductor+ac``'s measured peak; ``cap-lce``: the inputs plus the
  lower of the two ``F.linear_cross_entropy`` rows' peaks;
- ``ours+ac``: ``aot_pipeline.compile(step)`` with the auto_chunker on;
- ``eager-body-split8`` / ``-split16``: ``split=N`` with ``AOT_PARTITION_CHUNK_BODY=eager`` (each
  chunk as unfused ATen); the other rows of ours run the default ("auto": each chunk's body
  compiled by Inductor where a chunk holds 2**18 logits or more).

A variant that fails is a row with the error's one line. Models (``MODELS``): the GPT of our bar
(``aot_pipeline.models.GPT``, vocab 32,768), transformers' ``LlamaForCausalLM`` from a tiny
config at vocab 32,000 and 128,256 with fp32 and bf16 weights, and ``GPT2LMHeadModel``; the
transformers models are called as the Trainer calls them, ``model(input_ids=ids,
labels=labels).loss`` (their loss upcasts the logits to fp32).

    uv run python benchmarks/chunkers_bench.py --results   # writes RESULTS-chunkers.md
    uv run python benchmarks/chunkers_bench.py --smoke     # a tiny GPT: eager, inductor+ac, split4
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MIB = 2**20
LOSS_RTOL = {"float32": 1e-5, "bfloat16": 2**-8}


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    compiler: str  # "eager", "inductor" or "ours"
    step: str = "whole"  # "whole" (the model's own loss), "lce" or "liger"
    auto_chunker: bool = False
    split: int | str | None = None
    cap: str | None = None  # "ac" or "lce": resolved from earlier rows into bytes
    chunk_body: str | None = None  # AOT_PARTITION_CHUNK_BODY for ours (None: its default)


VARIANTS: dict[str, Variant] = {v.key: v for v in [
    Variant("eager", "eager", "eager"),
    Variant("inductor", "inductor", "inductor"),
    Variant("inductor+ac", "inductor + auto_chunker", "inductor", auto_chunker=True),
    Variant("lce-inductor", "F.linear_cross_entropy, inductor", "inductor", step="lce"),
    Variant("lce-ours", "F.linear_cross_entropy, ours", "ours", step="lce"),
    Variant("liger-inductor", "liger-style 8, inductor", "inductor", step="liger"),
    *[Variant(f"split{n}", f"ours split={n}", "ours", split=n) for n in (4, 8, 16, 32, 64)],
    Variant("cap-ac", "ours cap 0.7x auto_chunker (auto)", "ours", split="auto", cap="ac"),
    Variant("cap-lce", "ours cap F.lce (auto)", "ours", split="auto", cap="lce"),
    Variant("ours+ac", "ours + auto_chunker", "ours", auto_chunker=True),
    # the chunk loop as unfused ATen (the body before issue 50 item 3), beside the compiled one
    *[Variant(f"eager-body-split{n}", f"ours split={n}, eager chunk body", "ours", split=n,
              chunk_body="eager") for n in (8, 16)],
]}
CAP_SHARE = {"ac": 0.7, "lce": 1.0}


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "gpt" (aot_pipeline.models.GPT), "llama" or "gpt2" (transformers)
    vocab: int
    batch: int
    seq: int
    dim: int = 64
    layers: int = 2
    dtype: str = "float32"

    def describe(self) -> str:
        what = {"gpt": "aot_pipeline.models.GPT", "llama": "transformers LlamaForCausalLM",
                "gpt2": "transformers GPT2LMHeadModel"}[self.kind]
        extra = ", intermediate 128, 4 heads" if self.kind == "llama" else ", 4 heads"
        return (f"{what}: vocab {self.vocab:,}, dim {self.dim}, {self.layers} layers{extra}, "
                f"{self.dtype} weights, {self.batch} x {self.seq} tokens")


MODELS: dict[str, ModelSpec] = {
    "gpt": ModelSpec("gpt", 32768, 8, 256),
    "llama-32k": ModelSpec("llama", 32000, 4, 256),
    "llama-32k-bf16": ModelSpec("llama", 32000, 4, 256, dtype="bfloat16"),
    "llama-128k": ModelSpec("llama", 128256, 4, 256),
    "llama-128k-bf16": ModelSpec("llama", 128256, 4, 256, dtype="bfloat16"),
    "gpt2": ModelSpec("gpt2", 16384, 4, 256, dim=256),
    # For a lent GPU (gpu_proof.sh): GPT-2's head, as split_bench --quick there.
    "gpt-gpu": ModelSpec("gpt", 50304, 8, 1024, dim=768),
}
DEFAULT_MODELS = ("gpt", "llama-32k", "llama-32k-bf16", "llama-128k", "llama-128k-bf16", "gpt2")
# The smoke run: big enough a matmul for the auto_chunker (output over 2**20 elements and 8x
# its inputs), small enough to compile in seconds.
SMOKE_MODEL = ModelSpec("gpt", 2048, 8, 128, layers=1)
SMOKE_VARIANTS = ("eager", "inductor+ac", "split4")
GPU_VARIANTS = ("eager", "inductor", "inductor+ac", "lce-inductor", "split8", "cap-ac")


@dataclass
class Row:
    model: str
    variant: str
    label: str
    peak_mib: float | None = None
    step_ms: float | None = None
    step_cpu_ms: float | None = None  # the process's CPU time over the same steps
    compile_s: float | None = None
    loss: float | None = None
    loss_matches: bool | None = None
    grad_error: float | None = None
    inputs_mib: float | None = None
    split: str = ""  # what our split (and the auto_chunker, where on) did
    note: str = ""
    wall_s: float | None = None  # the subprocess, start to end
    step_times_ms: list[float] = field(default_factory=list)

    @property
    def step_min_ms(self) -> float | None:
        """The fastest timed step: the one the machine's other work disturbed least."""
        return min(self.step_times_ms) if self.step_times_ms else None


# --- one variant, in its own process -----------------------------------------------------------


@dataclass
class Case:
    """A model, its batch, its own training loss and the pieces a hand-written loss needs."""

    module: Any
    batch: tuple[Any, Any]
    step: Callable[..., Any]  # (ids, labels) -> loss, the model's own
    hidden: Callable[[Any], Any]  # ids -> [tokens, dim], the last hidden states
    targets: Callable[[Any], Any]  # labels -> [tokens], aligned with ``hidden``
    weight: Any
    bias: Any


def build_case(spec: ModelSpec, device: str) -> Case:
    import torch
    import torch.nn.functional as F
    from split_bench import Model, _batch, whole_step

    torch.manual_seed(0)
    dtype = getattr(torch, spec.dtype)
    batch = _batch(spec.vocab, spec.batch, spec.seq, device)
    if spec.kind == "gpt":
        gpt = Model(spec.vocab, spec.dim, spec.layers, spec.seq).to(device, dtype)
        return Case(gpt, batch, whole_step(gpt), lambda ids: gpt.hidden(ids).flatten(0, 1),
                    lambda labels: labels.flatten(), gpt.gpt.head.weight, gpt.gpt.head.bias)
    import transformers

    common = {"vocab_size": spec.vocab, "use_cache": False, "bos_token_id": 0,
              "eos_token_id": 0}
    if spec.kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=spec.dim, intermediate_size=2 * spec.dim,
            num_hidden_layers=spec.layers, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=spec.seq, **common)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            n_embd=spec.dim, n_layer=spec.layers, n_head=4, n_positions=spec.seq,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # unnamed, transformers logs a warning: a graph break
    model = model.to(device, dtype).train()
    body = model.model if spec.kind == "llama" else model.transformer

    def step(ids: Any, labels: Any) -> Any:
        return model(input_ids=ids, labels=labels).loss

    def hidden(ids: Any) -> Any:
        return body(input_ids=ids).last_hidden_state.flatten(0, 1)

    def targets(labels: Any) -> Any:  # transformers' shift: token t predicts label t + 1
        return F.pad(labels, (0, 1), value=-100)[:, 1:].flatten()

    return Case(model, batch, step, hidden, targets, model.lm_head.weight, None)


def loss_step(case: Case, step: str) -> Callable[..., Any]:
    import torch
    import torch.nn.functional as F
    from split_bench import liger_loss

    if step == "whole":
        return case.step
    if step == "lce":
        def lce(ids: Any, labels: Any) -> Any:
            return F.linear_cross_entropy(
                case.hidden(ids), case.weight, case.targets(labels), linear_bias=case.bias,
                options=torch.nn.LinearCrossEntropyOptions()).float()
        return lce

    def liger(ids: Any, labels: Any) -> Any:
        return liger_loss(case.hidden(ids), case.weight, case.bias, case.targets(labels), 8)
    return liger


def _split_summary(recorder: Any) -> str:
    parts = []
    for decision in getattr(recorder, "splits", []):
        mlp = type(decision.site).__name__.startswith("Mlp")
        if decision.chunks <= 1:
            parts.append("mlp whole" if mlp else "loss whole")
        else:
            mode = "" if mlp else f" ({decision.mode.replace('_', ' ')})"
            parts.append(f"{'mlp' if mlp else 'loss'} in {decision.chunks}{mode}")
    return "; ".join(parts) or "no split"


def run_variant(spec: dict[str, Any]) -> dict[str, Any]:
    """One variant's row (as a dict), measured in this process."""
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["auto_chunker"]:
        torch._inductor.config.auto_chunker.enable = True
    from aot_partition.memory_models.simulator import measure_peak

    device = spec["device"]
    model = ModelSpec(**spec["model_spec"])
    case = build_case(model, device)
    module = case.module
    step = loss_step(case, spec["step"])
    compiled: Any = None
    if spec["compiler"] == "inductor":
        call = torch.compile(step, backend="inductor")
    elif spec["compiler"] == "ours":
        import aot_pipeline

        kwargs: dict[str, Any] = {}
        if spec["split"] is not None:
            kwargs["split"] = spec["split"]
        if spec["cap_bytes"] is not None:
            kwargs["memory_budget"] = f"{spec['cap_bytes']}B peak"
        compiled = call = aot_pipeline.compile(step, **kwargs)
    else:
        call = step
    row: dict[str, Any] = {"inputs_mib": (
        sum(p.numel() * p.element_size() for p in module.parameters())
        + sum(t.numel() * t.element_size() for t in case.batch)) / MIB}

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def run() -> Any:
        loss = call(*case.batch)
        loss.backward()
        return loss

    def timed() -> tuple[float, float]:
        module.zero_grad(set_to_none=True)
        sync()
        start, cpu = time.perf_counter(), time.process_time()
        run()
        sync()
        return time.perf_counter() - start, time.process_time() - cpu

    try:
        module.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        loss = run()
        sync()
        row["compile_s"] = time.perf_counter() - start
        row["loss"] = float(loss)
        del loss
        times = [timed() for _ in range(spec["steps"])]
        module.zero_grad(set_to_none=True)
        peak = measure_peak(run, device)
    except Exception as error:  # the row says what failed; the bench goes on
        line = (str(error).strip().splitlines() or [""])[0]
        for text in str(error).splitlines():  # torch.compile wraps: keep the inner error
            if "Error:" in text and not text.startswith(" "):
                line = text.strip()
                break
        row["note"] = f"{type(error).__name__}: {line}"[:300]
        return row
    row["step_times_ms"] = [1000 * wall for wall, _ in times]
    row["step_ms"] = 1000 * statistics.median(wall for wall, _ in times)
    row["step_cpu_ms"] = 1000 * statistics.median(cpu for _, cpu in times)
    row["peak_mib"] = peak.peak_bytes / MIB
    done = []
    if compiled is not None:
        done.append(_split_summary(compiled.recorder))
    if spec["auto_chunker"]:
        from torch._inductor import metrics

        chunked = getattr(metrics, "num_auto_chunking", 0)
        done.append(f"auto_chunker chunked {chunked} graph{'s' * (chunked != 1)}")
    row["split"] = "; ".join(done)
    grads = {n: p.grad.detach().float().cpu() for n, p in module.named_parameters()
             if p.grad is not None}
    if spec["grads_path"] and spec["compiler"] == "eager" and spec["step"] == "whole":
        torch.save(grads, spec["grads_path"])
    elif spec["grads_path"] and os.path.exists(spec["grads_path"]):
        want = torch.load(spec["grads_path"])
        row["grad_error"] = max((float((grads[n] - g).abs().max()) if n in grads else
                                 float("inf")) for n, g in want.items())
    return row


def worker_main(spec_json: str, out_path: str) -> int:
    row = run_variant(json.loads(spec_json))
    with open(out_path, "w") as f:
        json.dump(row, f)
    return 0


# --- the bench ---------------------------------------------------------------------------------


def _cap_bytes(variant: Variant, rows: list[Row]) -> tuple[int | None, str]:
    """The cap of a ``cap-*`` variant from the rows measured so far: (bytes, note)."""
    if variant.cap is None:
        return None, ""
    if variant.cap == "ac":
        refs = [r for r in rows if r.variant == "inductor+ac"]
        what = "inductor + auto_chunker"
    else:
        refs = [r for r in rows if r.variant in ("lce-inductor", "lce-ours")]
        what = "F.linear_cross_entropy"
    refs = [r for r in refs if r.peak_mib is not None]
    eager = next((r for r in rows if r.inputs_mib is not None), None)
    if not refs or eager is None:
        return None, f"no cap: no measured {what} peak"
    ref = min(refs, key=lambda r: r.peak_mib or 0.0)
    share = CAP_SHARE[variant.cap]
    assert ref.peak_mib is not None and eager.inputs_mib is not None
    cap = int((eager.inputs_mib + share * ref.peak_mib) * MIB)
    return cap, (f"cap: inputs + {share:g} x {ref.label}'s peak ({share * ref.peak_mib:.1f} "
                 f"MiB above the inputs, {cap / MIB:.1f} MiB in all)")


def measure(name: str, model: ModelSpec, variant: Variant, rows: list[Row], args: Any,
            grads_path: str) -> Row:
    row = Row(name, variant.key, variant.label)
    cap, note = _cap_bytes(variant, rows)
    if variant.cap is not None and cap is None:
        row.note = note
        return row
    spec = {"model_spec": asdict(model), "device": args.device, "threads": args.threads,
            "steps": args.steps, "compiler": variant.compiler, "step": variant.step,
            "auto_chunker": variant.auto_chunker, "split": variant.split, "cap_bytes": cap,
            "grads_path": grads_path}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chunkers-") as tmp:
        out = os.path.join(tmp, "row.json")
        from aot_pipeline.train import cold_cache_environment

        env = dict(os.environ, **cold_cache_environment(os.path.join(tmp, "inductor")),
                   TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
                   OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
        env.pop("TORCHINDUCTOR_AUTO_CHUNKER", None)
        env.pop("AOT_PARTITION_CHUNK_BODY", None)
        if variant.chunk_body is not None:
            env["AOT_PARTITION_CHUNK_BODY"] = variant.chunk_body
        if variant.auto_chunker:
            env["TORCHINDUCTOR_AUTO_CHUNKER"] = "1"
        try:
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                                   json.dumps(spec), out], env=env, capture_output=True,
                                  text=True, timeout=args.timeout)
            if os.path.exists(out):
                with open(out) as f:
                    for key, value in json.load(f).items():
                        setattr(row, key, value)
            else:
                tail = [line for line in done.stderr.strip().splitlines() if line.strip()]
                row.note = (f"worker exited {done.returncode}: "
                            f"{tail[-1] if tail else 'no output'}")[:300]
        except subprocess.TimeoutExpired:
            row.note = f"timed out after {args.timeout} s"
    row.wall_s = time.perf_counter() - start
    if note:
        row.note = f"{note}; {row.note}" if row.note else note
    return row


def _loss_check(rows: list[Row], model: ModelSpec) -> None:
    eager = next((r for r in rows if r.variant == "eager" and r.loss is not None), None)
    for r in rows:
        if eager is None or r.loss is None or eager.loss is None:
            r.loss_matches = None
            continue
        r.loss_matches = abs(r.loss - eager.loss) <= LOSS_RTOL[model.dtype] * abs(eager.loss)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> list[str]:
    lines = ["| variant | peak MiB | step ms | steps min-max ms | step CPU ms | compile s | "
             "loss | matches eager | grad error | split | note |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        match = {True: "yes", False: "**no**", None: "-"}[r.loss_matches]
        spread = (f"{min(r.step_times_ms):.0f}-{max(r.step_times_ms):.0f}"
                  if r.step_times_ms else "-")
        lines.append(f"| {r.label} | {_fmt(r.peak_mib, '.1f')} | {_fmt(r.step_ms, '.1f')} | "
                     f"{spread} | {_fmt(r.step_cpu_ms, '.0f')} | {_fmt(r.compile_s, '.1f')} | "
                     f"{_fmt(r.loss, '.6f')} | {match} | {_fmt(r.grad_error, '.1e')} | "
                     f"{r.split} | {r.note} |")
    return lines


def _ours(rows: list[Row], clock: str = "step_ms") -> list[Row]:
    """Our split's rows (split=N and the caps) that ran."""
    return [r for r in rows if (r.variant.startswith("split") or r.variant.startswith("cap-"))
            and r.peak_mib is not None and getattr(r, clock) is not None]


def _row(rows: list[Row], key: str, clock: str = "step_ms") -> Row | None:
    return next((r for r in rows if r.variant == key and r.peak_mib is not None
                 and getattr(r, clock) is not None), None)


def targets(rows: list[Row], clock: str = "step_ms") -> list[str]:
    """T1 and T2 for one model, met or missed, with the measured numbers; ``clock``: the step
    time compared: the median step ("step_ms"), the fastest ("step_min_ms") or the process's
    CPU time ("step_cpu_ms")."""
    unit = {"step_ms": "ms", "step_min_ms": "ms (fastest step)",
            "step_cpu_ms": "CPU ms"}[clock]

    def t(r: Row) -> float:
        return float(getattr(r, clock))

    def peak(r: Row) -> float:
        return float(r.peak_mib or 0.0)

    def point(r: Row) -> str:
        return f"{r.label} {peak(r):.1f} MiB, {t(r):.0f} {unit}"

    ours = _ours(rows, clock)
    out = []
    ac = _row(rows, "inductor+ac", clock)
    if ac is None or not ours:
        out.append("- T1: not evaluated (no measured auto_chunker row or none of ours).")
    else:
        at_peak = [r for r in ours if peak(r) <= peak(ac)]
        if not at_peak:
            a = (f"missed: none of ours is at or under its peak ({peak(ac):.1f} MiB); our "
                 f"least is {point(min(ours, key=peak))}")
        else:
            fast = min(at_peak, key=t)
            ratio = t(fast) / t(ac)
            a = (f"{'met' if ratio <= 1 else 'missed'}: at or under its peak "
                 f"({peak(ac):.1f} MiB) our fastest is {point(fast)}, {ratio:.2f}x its "
                 f"{t(ac):.0f} {unit}" + ("" if ratio <= 1 else
                                          f" ({100 * (ratio - 1):.0f}% slower)"))
        as_fast = [r for r in ours if t(r) <= t(ac)]
        if not as_fast:
            b = (f"missed: none of ours is as fast as its {t(ac):.0f} {unit}; our fastest is "
                 f"{point(min(ours, key=t))}")
        else:
            low = min(as_fast, key=peak)
            cut = 1 - peak(low) / peak(ac)
            b = (f"{'met' if cut >= 0.3 else 'missed'}: at or under its step time "
                 f"({t(ac):.0f} {unit}) our lowest peak is {point(low)}, {100 * abs(cut):.0f}% "
                 f"{'under' if cut >= 0 else 'over'} its {peak(ac):.1f} MiB (target: 30% "
                 "under)")
        verdict = "met" if a.startswith("met") and b.startswith("met") else "missed"
        out.append(f"- T1 ({verdict}), against inductor + auto_chunker ({point(ac)}): "
                   f"(a) {a}; (b) {b}.")
    lces = [r for r in (_row(rows, "lce-inductor", clock), _row(rows, "lce-ours", clock))
            if r is not None]
    inductor = _row(rows, "inductor", clock)
    if not lces or inductor is None or not ours:
        out.append("- T2: not evaluated (no measured F.linear_cross_entropy or inductor row, "
                   "or none of ours).")
        return out
    lce = min(lces, key=peak)
    goal = 1.05 * peak(lce)
    in_time = [r for r in ours if t(r) <= t(inductor)]
    reach = [r for r in ours if peak(r) <= goal]
    head = (f"- T2 ({{}}), F.linear_cross_entropy's peak {peak(lce):.1f} MiB ({lce.label}; "
            f"within 5%: <= {goal:.1f} MiB) at no more than inductor's {t(inductor):.0f} "
            f"{unit}: ")
    hit = [r for r in in_time if peak(r) <= goal]
    if hit:
        out.append(head.format("met") + f"{point(min(hit, key=peak))}.")
        return out
    parts = []
    if in_time:
        low = min(in_time, key=peak)
        parts.append(f"within inductor's step time our lowest peak is {point(low)}, "
                     f"{100 * (peak(low) / peak(lce) - 1):.0f}% above it")
    else:
        parts.append("none of ours is as fast as inductor")
    if reach:
        quick = min(reach, key=t)
        parts.append(f"the fastest of ours within 5% of its peak is {point(quick)}, "
                     f"{100 * (t(quick) / t(inductor) - 1):.0f}% slower than inductor")
    else:
        least = min(ours, key=peak)
        parts.append(f"none of ours reaches it; our least peak is {point(least)}, "
                     f"{100 * (peak(least) / peak(lce) - 1):.0f}% above")
    out.append(head.format("missed") + "; ".join(parts) + ".")
    return out


PROTOCOL = __doc__.split("\n\n", 1)[1].split("\n    uv run")[0].strip()


def markdown(meta: dict[str, Any], rows: list[Row], results: bool) -> str:
    lines = ["## Chunkers: our split against Inductor's auto_chunker and F.linear_cross_entropy",
             "", f"Machine: {meta['machine']}; torch {meta['torch']}"
             f"{'; transformers ' + meta['transformers'] if meta.get('transformers') else ''}; "
             f"{meta['date']}; device {meta['device']}; {meta['threads']} torch threads; "
             f"{meta['steps']} timed steps.", ""]
    if results:
        lines += ["### Protocol", "", PROTOCOL, ""]
        if meta.get("protocol_note"):
            lines += [meta["protocol_note"], ""]
    for name in meta["models"]:
        mine = [r for r in rows if r.model == name]
        if not mine:
            continue
        lines += [f"### {name}", "", ModelSpec(**meta["model_specs"][name]).describe() + ".",
                  "", *table(mine), ""]
    if results:
        lines += ["### Targets", "",
                  "Ours: the rows of our split (split=N and the two caps). T1: at "
                  "inductor + auto_chunker's peak our step is no slower, and at its step time "
                  "our peak is at least 30% lower. T2: F.linear_cross_entropy's peak (the "
                  "lower of its two rows) reached within 5% at no more than Inductor's unsplit "
                  "step time. Each is judged twice: by the median step, as the issue states it, "
                  "and by the fastest of the timed steps, the one the machine's other work "
                  "disturbed least.", ""]
        for name in meta["models"]:
            mine = [r for r in rows if r.model == name]
            if mine:
                lines += [f"**{name}**", "", "By the median step (the issue's measure):",
                          *targets(mine), "", "By the fastest of the timed steps:",
                          *targets(mine, "step_min_ms"), ""]
    return "\n".join(lines).rstrip() + "\n"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    """An installed package's version, without importing it (the parent stays light)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def write(meta: dict[str, Any], rows: list[Row], out: str, results: bool) -> str:
    with open(os.path.join(out, "chunkers_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=2)
    text = markdown(meta, rows, results=False)
    with open(os.path.join(out, "chunkers_bench.md"), "w") as f:
        f.write(text)
    if results:
        with open(os.path.join(HERE, "RESULTS-chunkers.md"), "w") as f:
            f.write(markdown(meta, rows, results=True))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all; "
                             f"with --smoke {', '.join(SMOKE_VARIANTS)})")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per variant")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a tiny GPT (vocab {SMOKE_MODEL.vocab}), variants "
                             f"{', '.join(SMOKE_VARIANTS)}, one timed step")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of out/chunkers_bench.json and measure the rest")
    parser.add_argument("--render", action="store_true",
                        help="only write the tables again from out/chunkers_bench.json")
    parser.add_argument("--protocol-note", default="",
                        help="a line for the RESULTS protocol (what this run changed)")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true",
                        help="also write RESULTS-chunkers.md")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "chunkers_bench.json")
    if args.render:
        with open(json_path) as f:
            saved = json.load(f)
        if args.protocol_note:
            saved["meta"]["protocol_note"] = args.protocol_note
        print(write(saved["meta"], [Row(**r) for r in saved["rows"]], args.out, args.results))
        return 0
    models = {"gpt-smoke": SMOKE_MODEL} if args.smoke else {
        name: MODELS[name] for name in args.models.split(",")}
    keys = (tuple(args.variants.split(",")) if args.variants else
            SMOKE_VARIANTS if args.smoke else tuple(VARIANTS))
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.smoke:
        args.steps = 1
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({_cpu_model()})",
            "torch": _version("torch"), "transformers": _version("transformers"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": args.device, "threads": args.threads, "steps": args.steps,
            "models": list(models), "model_specs": {n: asdict(m) for n, m in models.items()},
            "variants": list(keys), "protocol_note": args.protocol_note}
    rows: list[Row] = []
    if args.resume and os.path.exists(json_path):
        with open(json_path) as f:
            rows = [Row(**r) for r in json.load(f)["rows"]]
    grads_dir = os.path.join(args.out, "chunkers_grads")  # eager's, for --resume too
    os.makedirs(grads_dir, exist_ok=True)
    for name, model in models.items():
        grads_path = os.path.join(grads_dir, f"{name}.pt")
        if not any(r.model == name and r.variant == "eager" for r in rows):
            if os.path.exists(grads_path):
                os.remove(grads_path)
        for key in keys:
            if any(r.model == name and r.variant == key for r in rows):
                continue
            row = measure(name, model, VARIANTS[key], [r for r in rows if r.model == name],
                          args, grads_path)
            rows.append(row)
            _loss_check([r for r in rows if r.model == name], model)
            print(f"{name:16s} {row.label:36s} peak {_fmt(row.peak_mib, '.1f')} MiB, step "
                  f"{_fmt(row.step_ms, '.1f')} ms, compile {_fmt(row.compile_s, '.1f')} s "
                  f"({_fmt(row.wall_s, '.0f')} s) {row.split} {row.note}", file=sys.stderr, flush=True)
            write(meta, rows, args.out, results=False)
    print(write(meta, rows, args.out, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
