"""What a cap costs to compile, by depth (issue 51, item 3).

The cold first step (tracing, partitioning, Inductor's codegen and C++ compiles, the step
itself) of a language model with its next-token cross-entropy inside the compiled region, at
2, 8, 16 and 32 layers, under each kind of budget our pipeline takes, beside Inductor's own
back end at its default and at torch's ``activation_memory_budget=0.5``:

- ``inductor``: ``torch.compile(step, backend="inductor")``; ``inductor@0.5``: the same with
  ``torch._functorch.config.activation_memory_budget = 0.5`` (torch's partitioner);
- ``ours``: ``aot_pipeline.compile(step)`` (uncapped); ``ours@0.5``: ``memory_budget=0.5``;
- ``ours-bytes``: a byte cap, half the saved activation bytes of the ``ours`` row of the same
  model and depth (``memory_budget="<N>B"``);
- ``ours-peak``: a peak cap, ``memory_budget="0.8 peak"``.

Models: ``gpt``, the built-in GPT (``aot_pipeline.models``, vocab 1,024, dim 64, 4 heads,
2 x 256 tokens) as ``BuiltModel.training_step()``; ``hf-llama``, transformers'
``LlamaForCausalLM`` from a tiny config (vocab 1,024, hidden 64, intermediate 128, 4 heads)
called as the Trainer calls it, ``model(input_ids=ids, labels=ids).loss``.

Protocol: every run in a fresh process with an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR``
a new folder), ``TORCHINDUCTOR_COMPILE_THREADS=1`` (the C++ compiles in waited-for children, so
CPU = this process + its children), 2 torch threads, the model built and ``torch._dynamo`` and
Inductor imported before the clock. The phases: our partitioner's calls (pricing included) and
the Inductor memory model's lowerings (``memory_models.inductor._lower``: the pricing), or
torch's partitioner inside Inductor; Inductor's codegen of the compiled graphs
(``fx_codegen_and_compile``, C++ compiles included); CPU seconds, inclusive.

    uv run python benchmarks/cap_compile_bench.py                              # the full table
    uv run python benchmarks/cap_compile_bench.py --models gpt --layers 2 8 --results

Writes ``benchmarks/out/cap_compile_bench.json`` (and with ``--results`` the markdown table
``benchmarks/out/cap_compile_bench.md``, to paste into RESULTS-compile-time.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compile_time_bench import Clock  # noqa: E402
from compile_time_bench import _Phases as TimedPhases  # noqa: E402

_INHERITED = object()  # a patched attribute the owner did not hold itself
VARIANTS = ("inductor", "inductor@0.5", "ours", "ours@0.5", "ours-bytes", "ours-peak")
MODELS = ("gpt", "hf-llama")
SIZES = {"vocab": 1024, "dim": 64, "heads": 4, "seq": 256, "batch": 2}


class _Phases(TimedPhases):
    """compile_time_bench's inclusive phase clocks, each patch undone by ``restore``."""

    def __init__(self) -> None:
        super().__init__()
        self._patched: list[tuple[Any, str, Any]] = []

    def patch(self, owner: Any, attr: str, name: str) -> None:
        if hasattr(owner, attr):  # a torch without it: the phase is not shown
            self._patched.append((owner, attr, vars(owner).get(attr, _INHERITED)))
            super().patch(owner, attr, name)

    def restore(self) -> None:
        """Every patched attribute as it was."""
        for owner, attr, original in reversed(self._patched):
            if original is _INHERITED:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        self._patched.clear()


def _build(model: str, layers: int, device: str
           ) -> tuple[Any, Callable[..., Any], tuple[Any, ...]]:
    """(module, step(*inputs) -> loss, inputs) on ``device``."""
    import torch

    torch.manual_seed(0)
    ids = torch.randint(0, SIZES["vocab"], (SIZES["batch"], SIZES["seq"]),
                        generator=torch.Generator().manual_seed(1)).to(device)
    if model == "gpt":
        from aot_pipeline.models import build_model

        built = build_model("gpt", layers=layers, batch=SIZES["batch"], vocab=SIZES["vocab"],
                            dim=SIZES["dim"], heads=SIZES["heads"], seq=SIZES["seq"],
                            device=device)
        step = built.training_step()
        return step, step, (ids,)
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=SIZES["vocab"], hidden_size=SIZES["dim"], intermediate_size=2 * SIZES["dim"],
        num_hidden_layers=layers, num_attention_heads=SIZES["heads"],
        num_key_value_heads=SIZES["heads"], max_position_embeddings=SIZES["seq"])
    llama = transformers.LlamaForCausalLM(config).to(device)

    def step(ids: Any) -> Any:
        return llama(input_ids=ids, labels=ids).loss

    return llama, step, (ids,)


def child(model: str, layers: int, variant: str, byte_cap: int | None,
          device: str) -> dict[str, Any]:
    """One cold first step; its clocks, phases and loss against eager."""

    import torch

    torch.set_num_threads(2)
    module, step, inputs = _build(model, layers, device)
    with torch.no_grad():
        eager_loss = float(step(*inputs))
    module.zero_grad(set_to_none=True)
    import aot_partition.memory_models.inductor as inductor_model
    import aot_pipeline
    import aot_pipeline.backend as backend
    import torch._dynamo  # noqa: F401  (imported before the clock, as by every variant)
    import torch._inductor.compile_fx as compile_fx

    phases = _Phases()
    phases.patch(backend.AotPipelinePartitioner, "__call__", "our partitioner (pricing in it)")
    phases.patch(inductor_model, "_lower", "pricing: Inductor model lowerings")
    phases.patch(compile_fx, "min_cut_rematerialization_partition", "torch's partitioner")
    # Inductor's codegen of each compiled graph (forward, backward), C++ compiles included.
    phases.patch(compile_fx, "fx_codegen_and_compile", "Inductor codegen (fw, bw)")

    clock = Clock()
    compiled: Any
    try:
        # torch's own flag only for its own partitioner (ours refuses a flag it contradicts)
        with (torch._functorch.config.patch(activation_memory_budget=0.5)
              if variant == "inductor@0.5" else contextlib.nullcontext()):
            if variant.startswith("inductor"):
                compiled = torch.compile(step, backend="inductor")
            else:
                budget: float | str | None = {"ours": None, "ours@0.5": 0.5,
                                              "ours-peak": "0.8 peak",
                                              "ours-bytes": f"{byte_cap}B"}[variant]
                compiled = aot_pipeline.compile(step, memory_budget=budget)
            loss = compiled(*inputs)
            loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        phases.restore()
    wall, cpu, children = clock.read()
    saved = getattr(compiled, "saved_activation_bytes", None)
    return {"model": model, "layers": layers, "variant": variant, "device": device,
            "wall_s": wall,
            "cpu_s": cpu + children, "children_cpu_s": children, "byte_cap": byte_cap,
            "saved_activation_bytes": saved() if callable(saved) else saved,
            "loss_matches_eager": abs(float(loss.detach()) - eager_loss) <= 1e-4 * max(1.0, abs(eager_loss)),
            "phases_cpu_s": phases.cpu, "phase_calls": phases.calls}


def _run(model: str, layers: int, variant: str, byte_cap: int | None, device: str,
         timeout: float) -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix="cap-compile-bench-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "AOT_PIPELINE_SHARED_INDUCTOR_CACHE": "0"}
    command = [sys.executable, os.path.abspath(__file__), "--child", model, str(layers), variant,
               str(byte_cap or 0), device]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "layers": layers, "variant": variant,
                "error": f"timed out after {timeout:.0f} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"model": model, "layers": layers, "variant": variant, "error": last[:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "failed"
    text = f"{row['wall_s']:.1f}"
    if base is not None and "error" not in base and row is not base:
        text += f" ({row['wall_s'] / base['wall_s']:.2f}x)"
    return text


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [f"Machine: {meta['machine']}; device {meta.get('device', 'cpu')}; torch "
             f"{meta['torch']}; {meta['date']}; cold "
             "first step, each run in a fresh process with an empty Inductor cache "
             "(`benchmarks/cap_compile_bench.py`).", "",
             "Wall seconds (ratio to `inductor` at the same depth):", "",
             "| model | layers | " + " | ".join(VARIANTS) + " |",
             "|---|---:|" + "---:|" * len(VARIANTS)]
    keys = sorted({(r["model"], r["layers"]) for r in rows},
                  key=lambda k: (MODELS.index(k[0]), k[1]))
    found = {(r["model"], r["layers"], r["variant"]): r for r in rows}
    for model, layers in keys:
        base = found.get((model, layers, "inductor"))
        cells = [_cell(found.get((model, layers, v)), base) for v in VARIANTS]
        lines.append(f"| {model} | {layers} | " + " | ".join(cells) + " |")
    lines += ["", "Where the CPU went (seconds, inclusive; CPU = the process and its C++ "
              "compiler children; lowerings = the Inductor memory model pricing cuts):", "",
              "| model | layers | variant | CPU s | partitioner s | pricing s (lowerings) | "
              "Inductor codegen s (graphs) | loss = eager |",
              "|---|---:|---|---:|---:|---:|---:|---|"]
    for model, layers in keys:
        for variant in VARIANTS:
            row = found.get((model, layers, variant))
            if row is None:
                continue
            if "error" in row:
                lines.append(f"| {model} | {layers} | {variant} | - | - | - | - | "
                             f"{row['error']} |")
                continue
            p, calls = row["phases_cpu_s"], row["phase_calls"]
            part = p.get("our partitioner (pricing in it)", p.get("torch's partitioner", 0.0))
            lowering = p.get("pricing: Inductor model lowerings", 0.0)
            n = calls.get("pricing: Inductor model lowerings", 0)
            lines.append(f"| {model} | {layers} | {variant} | {row['cpu_s']:.1f} | {part:.1f} | "
                         f"{lowering:.1f} ({n}) | "
                         f"{p.get('Inductor codegen (fw, bw)', 0.0):.1f} "
                         f"({calls.get('Inductor codegen (fw, bw)', 0)}) | "
                         f"{'yes' if row['loss_matches_eager'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--layers", nargs="+", type=int, default=[2, 8, 16, 32])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true", help="also write the markdown table")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, layers, variant, cap, device = args.child
        print(json.dumps(child(model, int(layers), variant, int(cap) or None, device)))
        return
    if "ours-bytes" in args.variants and "ours" not in args.variants:
        parser.error("ours-bytes takes its cap from the ours row: name ours too")
    import torch

    os.makedirs(args.out, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"
            + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""),
            "device": args.device, "torch": torch.__version__}
    rows: list[dict[str, Any]] = []
    path = os.path.join(args.out, "cap_compile_bench.json")
    order = [v for v in VARIANTS if v in args.variants]
    for model in args.models:
        for layers in args.layers:
            ours_saved = None
            for variant in order:
                if variant == "ours-bytes" and not ours_saved:
                    rows.append({"model": model, "layers": layers, "variant": variant,
                                 "error": "no byte cap: the ours row saved nothing known"})
                    continue
                cap = ours_saved // 2 if variant == "ours-bytes" and ours_saved else None
                row = _run(model, layers, variant, cap, args.device, args.timeout)
                if variant == "ours" and "error" not in row:
                    ours_saved = row.get("saved_activation_bytes")
                rows.append(row)
                said = row.get("error") or (f"wall {row['wall_s']:.1f} s, CPU "
                                            f"{row['cpu_s']:.1f} s")
                print(f"{model} {layers:2d} layers {variant:13s} {said}", flush=True)
                with open(path, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.results:
        with open(os.path.join(args.out, "cap_compile_bench.md"), "w") as f:
            f.write(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
