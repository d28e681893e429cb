"""Split: the LM head and its loss in chunks of tokens, measured against what people do today.

One training step of a GPT with a large vocabulary (the loss, in fp32, inside the compiled
region), every row in this process, side by side:

- ``eager``; ``inductor@1.0`` (torch.compile, torch's partitioner); ``torch@0.5`` (the same
  with torch's ``activation_memory_budget = 0.5``); ``ours@0.5`` (aot_pipeline, split off);
- ``ours split=N`` (aot_pipeline at budget 1.0, the head and loss in N chunks, gradients made
  in the forward); ``ours cap (auto)``: ``memory_budget="<bytes> peak"`` at 40% of
  ``inductor@1.0``'s peak, which only a split reaches, ``split="auto"`` (the default);
- hand-chunked baselines written here in plain torch ops, compiled by Inductor (torch's
  partitioner): ``torchtune-style`` (the loss per chunk of hidden states under
  ``torch.utils.checkpoint``), ``liger-style`` (an autograd.Function computing the gradients
  chunk by chunk in the forward, as Liger Kernel's fused linear cross-entropy), and both in
  eager.

Peaks above the memory allocated before the step (CPU: the profiler's allocation events; CUDA:
``max_memory_allocated``), step time the median of ``--steps`` steps. Also draws the
compiled-program model's memory timeline of one step, whole and split (``split_timeline.png``).

    uv run python benchmarks/split_bench.py --results     # writes RESULTS-split.md
    uv run python benchmarks/split_bench.py --smoke       # a small vocabulary, 3 rows
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2**20


@dataclass
class Row:
    variant: str
    peak_mib: float | None
    step_ms: float | None
    loss: float | None
    max_grad_error: float | None  # against eager, largest |difference| over every gradient
    note: str = ""


class Model(torch.nn.Module):
    """The built-in GPT's body with the head as a separate weight (the baselines chunk it)."""

    def __init__(self, vocab: int, dim: int, layers: int, seq: int) -> None:
        super().__init__()
        from aot_pipeline.models import build_model

        self.gpt = build_model("gpt", vocab=vocab, dim=dim, heads=4, layers=layers,
                               seq=seq).module

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        gpt = self.gpt
        x = gpt.tok(ids) + gpt.pos[: ids.shape[1]]
        for block in gpt.blocks:
            x = block(x)
        return gpt.ln(x)


def whole_step(model: Model) -> Callable[..., torch.Tensor]:
    def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(model.hidden(ids), model.gpt.head.weight, model.gpt.head.bias)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    return step


def torchtune_loss(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor,
                   chunks: int) -> torch.Tensor:
    """torchtune's chunked output and loss: each chunk's logits under activation
    checkpointing, the sum of the chunk losses over the tokens not ignored. ``h``: [tokens,
    dim]; ``t``: [tokens]."""
    def chunk_loss(hc: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hc, w, b).float()
        return F.cross_entropy(logits, tc, reduction="sum")

    total = sum(checkpoint(chunk_loss, hc, tc, use_reentrant=False)
                for hc, tc in zip(h.chunk(chunks), t.chunk(chunks)))
    return total / (t != -100).sum()


def torchtune_step(model: Model, chunks: int) -> Callable[..., torch.Tensor]:
    def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torchtune_loss(model.hidden(ids).flatten(0, 1), model.gpt.head.weight,
                              model.gpt.head.bias, labels.flatten(), chunks)
    return step


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger's fused linear cross-entropy in plain torch ops: the gradients of hidden, weight
    and bias computed chunk by chunk in the forward; the backward scales them."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                t: torch.Tensor, chunks: int) -> torch.Tensor:
        count = (t != -100).sum()
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(w)
        grad_b = torch.zeros_like(b) if b is not None else None
        total = h.new_zeros((), dtype=torch.float32)
        size = -(-h.shape[0] // chunks)
        for start in range(0, h.shape[0], size):
            hc, tc = h[start:start + size], t[start:start + size]
            logits = F.linear(hc, w, b).float()
            kept = tc != -100
            lse = torch.logsumexp(logits, -1)
            picked = logits.gather(1, torch.where(kept, tc, 0)[:, None])[:, 0]
            total = total + torch.where(kept, lse - picked, 0).sum()
            g = torch.softmax(logits, -1)
            g[torch.arange(g.shape[0]), torch.where(kept, tc, 0)] -= 1
            g = (g * (kept[:, None] / count)).to(h.dtype)
            grad_h[start:start + size] = g @ w
            grad_w += g.t() @ hc
            if grad_b is not None:
                grad_b += g.sum(0)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        return total / count

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad_h, grad_w, grad_b = ctx.saved_tensors
        return (grad_h * grad, grad_w * grad, None if grad_b is None else grad_b * grad,
                None, None)


def liger_loss(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor,
               chunks: int) -> torch.Tensor:
    """Liger-style fused linear cross-entropy (``_FusedLinearCrossEntropy``); ``h``: [tokens,
    dim]; ``t``: [tokens]."""
    return _FusedLinearCrossEntropy.apply(h, w, b, t, chunks)


def liger_step(model: Model, chunks: int) -> Callable[..., torch.Tensor]:
    def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return liger_loss(model.hidden(ids).flatten(0, 1), model.gpt.head.weight,
                          model.gpt.head.bias, labels.flatten(), chunks)
    return step


def _batch(vocab: int, batch: int, seq: int, device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[:, : seq // 8] = -100  # a prompt the loss ignores
    return ids.to(device), labels.to(device)


def measure(variant: str, model: Model, call: Callable[..., torch.Tensor],
            batch: tuple[torch.Tensor, ...], device: str, steps: int,
            eager_grads: dict[str, torch.Tensor] | None, note: str = "") -> Row:
    from aot_partition.memory_models.simulator import measure_peak

    def run() -> torch.Tensor:
        loss = call(*batch)
        loss.backward()
        return loss

    try:
        model.zero_grad(set_to_none=True)
        loss = run()
        run()
    except Exception as error:  # an unreachable cap fails the compile: the row says so
        return Row(variant, None, None, None, None, f"{type(error).__name__}: "
                   f"{str(error).splitlines()[0][:160]}")
    error = None
    if eager_grads is not None:
        model.zero_grad(set_to_none=True)
        run()
        error = max(float((p.grad - eager_grads[n]).abs().max())
                    for n, p in model.named_parameters() if p.grad is not None)
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    peak = measure_peak(run, device)
    return Row(variant, peak.peak_bytes / MIB, 1000 * statistics.median(times), float(loss),
               error, note)


def timeline_png(model: Model, batch: tuple[torch.Tensor, ...], chunks: int, path: str) -> None:
    """The compiled-program model's live bytes over one step, whole and split."""
    import aot_pipeline
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from aot_partition.memory_models.inductor import simulate_compiled_partition

    fig, ax = plt.subplots(figsize=(9, 4))
    for split, label in ((False, "whole"), (chunks, f"split in {chunks}")):
        torch._dynamo.reset()
        compiled = aot_pipeline.compile(whole_step(model), split=split)
        model.zero_grad(set_to_none=True)
        compiled(*batch).backward()
        part = compiled.recorder.partitions[0]
        timeline = simulate_compiled_partition(copy.deepcopy(part.forward),
                                               copy.deepcopy(part.backward))
        base = timeline.baseline_bytes
        steps = timeline.steps
        xs = [i / max(1, len(steps) - 1) for i in range(len(steps))]
        ax.plot(xs, [(s.high_bytes - base) / MIB for s in steps], label=
                f"{label}: peak {timeline.peak_above_baseline / MIB:.0f} MiB")
        backward = next(i for i, s in enumerate(steps) if s.phase == "backward")
        ax.axvline(xs[backward], color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("step progress (forward | backward), Inductor's buffers")
    ax.set_ylabel("MiB above the inputs")
    ax.set_title("One training step's memory, the LM head and loss whole and split")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smoke", action="store_true", help="vocab 512, seq 64: three rows")
    parser.add_argument("--quick", action="store_true",
                        help="only inductor@1.0, torch@0.5, ours split=N and the compiled "
                             "Liger-style baseline (a lent GPU's time is short)")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true", help="also write RESULTS-split.md")
    args = parser.parse_args(argv)
    if args.smoke:
        args.vocab, args.seq, args.steps = 512, 64, 1
    os.makedirs(args.out, exist_ok=True)
    import aot_pipeline

    torch.manual_seed(0)
    model = Model(args.vocab, args.dim, args.layers, args.seq).to(args.device)
    batch = _batch(args.vocab, args.batch, args.seq, args.device)
    model.zero_grad(set_to_none=True)
    whole_step(model)(*batch).backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    rows: list[Row] = []

    def add(variant: str, make: Callable[[], Callable[..., torch.Tensor]], note: str = "",
            budget: float | None = None) -> None:
        torch._dynamo.reset()
        import torch._functorch.config as torch_config

        with torch_config.patch(activation_memory_budget=budget or 1.0):
            rows.append(measure(variant, model, make(), batch, args.device, args.steps,
                                eager_grads, note))
        print(f"{variant:28s} {rows[-1].peak_mib} MiB {rows[-1].step_ms} ms {rows[-1].note}",
              file=sys.stderr)

    compile_inductor = lambda step: torch.compile(step, backend="inductor")  # noqa: E731
    if not args.quick:
        add("eager", lambda: whole_step(model))
    add("inductor@1.0", lambda: compile_inductor(whole_step(model)))
    if not args.smoke:
        add("torch@0.5", lambda: compile_inductor(whole_step(model)), budget=0.5)
    if not (args.smoke or args.quick):
        add("ours@0.5", lambda: aot_pipeline.compile(whole_step(model), memory_budget=0.5,
                                                     split=False))
    add(f"ours split={args.chunks}", lambda: aot_pipeline.compile(whole_step(model),
                                                                  split=args.chunks))
    if args.quick:
        add(f"liger-style {args.chunks}, inductor",
            lambda: compile_inductor(liger_step(model, args.chunks)))
    inductor_peak = next(r.peak_mib for r in rows if r.variant == "inductor@1.0")
    if not (args.smoke or args.quick) and inductor_peak is not None:
        inputs = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            t.numel() * t.element_size() for t in batch)
        cap = inputs + int(0.4 * inductor_peak * MIB)
        add("ours cap (auto)", lambda: aot_pipeline.compile(
            whole_step(model), memory_budget=f"{cap}B peak"),
            note=f"cap: inputs + 40% of inductor@1.0's peak ({cap / MIB:.1f} MiB in all)")
        add(f"torchtune-style {args.chunks}, eager", lambda: torchtune_step(model, args.chunks))
        add(f"torchtune-style {args.chunks}, inductor",
            lambda: compile_inductor(torchtune_step(model, args.chunks)))
        add(f"liger-style {args.chunks}, eager", lambda: liger_step(model, args.chunks))
        add(f"liger-style {args.chunks}, inductor",
            lambda: compile_inductor(liger_step(model, args.chunks)))
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "device": args.device, "vocab": args.vocab, "dim": args.dim,
            "layers": args.layers, "tokens": f"{args.batch} x {args.seq}",
            "chunks": args.chunks}
    text = markdown(rows, meta)
    print(text)
    with open(os.path.join(args.out, "split_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=2)
    with open(os.path.join(args.out, "split_bench.md"), "w") as f:
        f.write(text)
    if not (args.smoke or args.quick):
        timeline_png(model, batch, args.chunks, os.path.join(
            HERE if args.results else args.out, "split_timeline.png"))
    if args.results:
        with open(os.path.join(HERE, "RESULTS-split.md"), "w") as f:
            f.write(text)
    return 0


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        "## Split: the LM head and its loss in chunks of tokens, measured",
        "",
        f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['date']}; device "
        f"{meta['device']}. GPT, vocab {meta['vocab']}, dim {meta['dim']}, {meta['layers']} "
        f"layers, {meta['tokens']} tokens (1/8 of them ignored, -100), the loss in fp32 inside "
        f"the compiled region; {meta['chunks']} chunks. Peak: MiB above the memory allocated "
        "before the step (profiler allocation events on CPU). Grad error: the largest "
        "|difference| from eager's gradients over every parameter.",
        "",
        "| variant | peak MiB | step ms | loss | grad error | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        peak = f"{r.peak_mib:.1f}" if r.peak_mib is not None else "-"
        step = f"{r.step_ms:.1f}" if r.step_ms is not None else "-"
        loss = f"{r.loss:.6f}" if r.loss is not None else "-"
        err = f"{r.max_grad_error:.1e}" if r.max_grad_error is not None else "-"
        lines.append(f"| {r.variant} | {peak} | {step} | {loss} | {err} | {r.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
