"""Split: the token-wise MLP in chunks of tokens (Mini-Sequence Transformer), measured.

One training step of a long-sequence Llama-style stack (RMSNorm, causal SDPA attention, a
SwiGLU MLP by default; the LM head and its fp32 loss inside the compiled region), compiled by
Inductor, every row in this process:

- ``whole``: torch.compile's own pipeline (torch's partitioner) at ``activation_memory_budget``
  1.0 and 0.0 (0.0: recompute whatever the partitioner may);
- ``mlp split N``: the same, each MLP replaced first by ``torch.ops.aot_partition.token_mlp``
  in N chunks (``find_split_sites(gm, kinds=("mlp",))`` and ``split_token_wise`` in a small back
  end before Inductor's ``compile_fx``): the forward keeps x only, the backward recomputes
  each chunk's intermediates;
- the same two with aot_pipeline's partitioner (``ours``) at budget 0.0.

Peaks above the memory allocated before the step (CPU: the profiler's allocation events, as
split_bench.py measures, ``measure_peak``), the largest gradient difference from eager's; step
time the median of ``--steps`` rounds, each round one step of every variant (all compiled
first, each keeping its own code), so that the load of other processes on shared cores falls
on every variant alike. One thread by default (``--threads``).

    uv run python benchmarks/split_mlp_bench.py --results   # writes RESULTS-split-mlp.md
    uv run python benchmarks/split_mlp_bench.py --smoke     # tiny, a few rows
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
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from split_bench import MIB, Row  # noqa: E402 - split_bench's rows


class Block(nn.Module):
    """RMSNorm, causal SDPA attention, RMSNorm, an MLP (SwiGLU or GELU), residuals."""

    def __init__(self, dim: int, heads: int, hidden: int, gated: bool, sdpa: bool = True
                 ) -> None:
        super().__init__()
        from aot_pipeline.models import CausalSelfAttention, RMSNorm

        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, sdpa=sdpa)
        self.gated = gated
        self.up = nn.Linear(dim, hidden, bias=not gated)
        self.gate = nn.Linear(dim, hidden, bias=False) if gated else None
        self.down = nn.Linear(hidden, dim, bias=not gated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        if self.gate is not None:
            return x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x + self.down(F.gelu(self.up(h)))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, layers: int,
                 gated: bool, sdpa: bool = True) -> None:
        super().__init__()
        from aot_pipeline.models import RMSNorm

        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, gated, sdpa)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def step_of(model: Model, tag: str = "") -> Callable[..., torch.Tensor]:
    """The training step's loss; ``tag``: a code object of its own, so that each variant keeps
    its own compiled code in Dynamo's cache (all of them are timed side by side)."""
    def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(ids).flatten(0, 1).float(), labels.flatten())
    if tag:
        step.__code__ = step.__code__.replace(co_name=f"step_{tag}")
    return step


def mlp_split_backend(chunks: int, inner: Callable[..., Any] | None = None,
                      found: list[Any] | None = None) -> Callable[..., Any]:
    """A torch.compile back end: each MLP in ``chunks`` chunks, then ``inner`` (Inductor's
    ``compile_fx`` by default)."""
    from aot_partition.split.token_split import find_split_sites, split_token_wise

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        sites, left = find_split_sites(gm, kinds=("mlp",))
        decisions = split_token_wise(gm, chunks, sites=sites)
        if found is not None:
            found.append((decisions, left))
        if inner is not None:
            return inner(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)
    return backend


def prepare(variants: list[tuple[str, Callable[[], Callable[..., torch.Tensor]], float]],
            model: Model, batch: tuple[torch.Tensor, ...],
            eager_grads: dict[str, torch.Tensor], found: dict[str, list[Any]], layers: int
            ) -> tuple[list[Row], dict[str, Callable[[], torch.Tensor]]]:
    """Compile each variant under its budget (two warm steps), its gradients against eager's
    and its peak as split_bench measures it; the step of each that ran."""
    import torch._functorch.config as torch_config
    from aot_partition.memory_models.simulator import measure_peak

    rows: list[Row] = []
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    for i, (variant, make, budget) in enumerate(variants):
        with torch_config.patch(activation_memory_budget=budget):
            fn = make()

            def run(fn: Callable[..., torch.Tensor] = fn) -> torch.Tensor:
                loss = fn(*batch)
                loss.backward()
                return loss.detach()

            try:
                model.zero_grad(set_to_none=True)
                loss = run()
                model.zero_grad(set_to_none=True)
                run()
            except Exception as error:
                rows.append(Row(variant, None, None, None, None, f"{type(error).__name__}: "
                                f"{str(error).splitlines()[0][:160]}"))
                continue
        error = max(float((p.grad - eager_grads[n]).abs().max())
                    for n, p in model.named_parameters() if p.grad is not None)
        model.zero_grad(set_to_none=True)
        peak = measure_peak(run, "cpu")
        note = ""
        split = [d for ds, _ in found.get(f"v{i}", []) for d in ds]
        if f"v{i}" in found:
            note = f"{len(split)} MLPs split" + ("" if len(split) == layers else " (not all)")
        rows.append(Row(variant, peak.peak_bytes / MIB, None, float(loss), error, note))
        calls[variant] = run
        print(f"{variant:28s} peak {rows[-1].peak_mib:.1f} MiB, grad error {error:.1e}",
              file=sys.stderr, flush=True)
    return rows, calls


def time_side_by_side(calls: dict[str, Callable[[], torch.Tensor]], model: Model,
                      batch: tuple[torch.Tensor, ...], steps: int) -> dict[str, list[float]]:
    """``steps`` rounds, each one step of every variant (the order rotated each round), so a
    neighbour's load on shared cores falls on all variants alike."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(steps):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
        print(f"round {round_ + 1}/{steps}", file=sys.stderr, flush=True)
    return times


def _batch(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[:, : seq // 8] = -100
    return ids, labels


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=688)
    parser.add_argument("--plain", action="store_true",
                        help="a GELU MLP with biases (GPT's) instead of SwiGLU")
    parser.add_argument("--written-attention", action="store_true",
                        help="attention written out (matmul, softmax: [seq x seq] scores per "
                             "head) instead of SDPA")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's (and Inductor's OpenMP) threads: 1 keeps step times "
                             "steady on shared cores, where waiting OpenMP threads spin")
    parser.add_argument("--no-ours", action="store_true", help="skip aot_pipeline's rows")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one step")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true",
                        help="also write RESULTS-split-mlp.md (appends with --append)")
    parser.add_argument("--append", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.dim, args.hidden, args.seq, args.batch, args.steps = 32, 88, 64, 2, 1
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(args.threads)
    import aot_pipeline

    torch.manual_seed(0)
    model = Model(args.vocab, args.dim, args.heads, args.hidden, args.layers, not args.plain,
                  sdpa=not args.written_attention)
    batch = _batch(args.vocab, args.batch, args.seq)
    model.zero_grad(set_to_none=True)
    step_of(model)(*batch).backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    variants: list[tuple[str, Callable[[], Callable[..., torch.Tensor]], float]] = []

    def add(variant: str, make: Callable[[str], Callable[..., torch.Tensor]],
            budget: float) -> None:
        tag = f"v{len(variants)}"
        variants.append((variant, lambda: make(tag), budget))

    def split(chunks: int, inner: Callable[[], Any] | None = None
              ) -> Callable[[str], Callable[..., torch.Tensor]]:
        return lambda tag: torch.compile(step_of(model, tag), backend=mlp_split_backend(
            chunks, inner() if inner is not None else None, found.setdefault(tag, [])))

    found: dict[str, list[Any]] = {}
    if not args.smoke:
        add("eager", lambda tag: step_of(model), 1.0)
    for budget in (1.0, 0.0):
        add(f"torch@{budget:.1f} whole",
            lambda tag: torch.compile(step_of(model, tag), backend="inductor"), budget)
        for chunks in args.chunks:
            add(f"torch@{budget:.1f} mlp split {chunks}", split(chunks), budget)
    if not (args.no_ours or args.smoke):
        def ours() -> Callable[..., Any]:
            return aot_pipeline.make_backend({"memory_budget": 0.0, "split": False})
        add("ours@0.0 whole", lambda tag: torch.compile(step_of(model, tag), backend=ours()),
            0.0)
        add(f"ours@0.0 mlp split {max(args.chunks)}", split(max(args.chunks), ours), 0.0)

    rows, calls = prepare(variants, model, batch, eager_grads, found, args.layers)
    times = time_side_by_side(calls, model, batch, args.steps)
    for row in rows:
        if row.variant in times:
            row.step_ms = 1000 * statistics.median(times[row.variant])
    date = subprocess.run(["date", "-u"], capture_output=True, text=True,
                          check=False).stdout.strip() or datetime.datetime.now(
        datetime.timezone.utc).isoformat()
    meta = {"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs visible "
                       f"(torch threads {torch.get_num_threads()})",
            "torch": torch.__version__, "date": date,
            "mlp": (f"GELU {args.dim} -> {args.hidden} -> {args.dim}, biases" if args.plain
                    else f"SwiGLU {args.dim} -> {args.hidden} -> {args.dim}, no biases"),
            "layers": args.layers, "heads": args.heads, "vocab": args.vocab,
            "attention": ("written out (matmul, softmax)" if args.written_attention
                          else "causal SDPA"),
            "tokens": f"{args.batch} x {args.seq}",
            "intermediate_mib": args.batch * args.seq * args.hidden * 4 / MIB}
    text = markdown(rows, meta)
    print(text)
    name = "split_mlp_bench" + ("_plain" if args.plain else "")
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=2)
    if args.results:
        with open(os.path.join(HERE, "RESULTS-split-mlp.md"), "a" if args.append else "w") as f:
            if not args.append:
                f.write("## Split: the token-wise MLP in chunks of tokens (MsT), measured\n\n"
                        "Written by `benchmarks/split_mlp_bench.py --results` (further "
                        "configurations with `--append`).\n\n")
            f.write(text)
    return 0


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        f"### {meta['mlp']}, {meta['layers']} layers, {meta['tokens']} tokens"
        + (", attention written out" if meta["attention"].startswith("written") else ""),
        "",
        f"Machine: {meta['machine']}; torch {meta['torch']}; {meta['date']}; device cpu. "
        f"{meta['heads']} heads ({meta['attention']}), vocab {meta['vocab']} (the loss in fp32 inside "
        f"the compiled step, 1/8 of the tokens ignored); one [tokens x hidden] fp32 "
        f"intermediate is {meta['intermediate_mib']:.1f} MiB. Peak: MiB above the memory "
        "allocated before the step (profiler allocation events). Step: the median of the rounds, "
        "every variant one step a round. Grad error: the largest "
        "|difference| from eager's gradients over every parameter.",
        "",
        "| variant | peak MiB | step ms | loss | grad error | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        peak = f"{r.peak_mib:.1f}" if r.peak_mib is not None else "-"
        step = f"{r.step_ms:.0f}" if r.step_ms is not None else "-"
        loss = f"{r.loss:.6f}" if r.loss is not None else "-"
        err = f"{r.max_grad_error:.1e}" if r.max_grad_error is not None else "-"
        lines.append(f"| {r.variant} | {peak} | {step} | {loss} | {err} | {r.note} |")
    return "\n".join(lines) + "\n\n"


if __name__ == "__main__":
    sys.exit(main())
