"""Correctness under a memory budget: models with dropout and batch norm, ours against torch's.

For each model and budget, eager and each partitioner (through ``aot_module`` with nop
compilers) run one training step from the same seed; on CPU both draw the same dropout
masks, so every gradient and buffer must equal eager's. Columns: the largest difference from
eager over outputs, gradients and buffers (or the error raised), saved activation bytes, and
for ours the random ops replayed in the backward with the bytes of RNG state saved for them
against the bytes of the dropout outputs and masks torch would save instead.

Used by ``partition_bench.py`` (a section of its report); runs alone too:

    uv run python benchmarks/recompute_correctness.py
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition, saved_activation_bytes
from aot_partition.fx.sizes import node_nbytes
from functorch.compile import aot_module, make_boxed_func
from torch import nn
from torch._functorch import config as torch_config
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut_partition,
)
from torch._prims.rng_prims import run_and_save_rng_state

BUDGETS = (1.0, 0.5, 0.0)
TOLERANCE = 1e-4


class DropoutMLP(nn.Module):
    """A residual MLP stack with dropout after every block (masks are big activations)."""

    def __init__(self, dim: int = 256, layers: int = 4, p: float = 0.2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim),
                                                  nn.GELU(), nn.Linear(2 * dim, dim))
                                    for _ in range(layers))
        self.p = p

    def forward(self, x):
        for block in self.blocks:
            x = x + F.dropout(block(x), self.p, training=True)
        return x


class BatchNormCNN(nn.Module):
    """Conv + training-mode batch norm blocks and a dropout head."""

    def __init__(self, channels: int = 16, layers: int = 3, p: float = 0.3) -> None:
        super().__init__()
        blocks, ch = [], 3
        for _ in range(layers):
            blocks += [nn.Conv2d(ch, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()]
            ch = channels
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, 10)
        self.p = p

    def forward(self, x):
        h = self.features(x).mean((2, 3))
        return self.head(F.dropout(h, self.p, training=True))


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "dropout-mlp": lambda: (DropoutMLP(), torch.randn(64, 256)),
    "bn-cnn": lambda: (BatchNormCNN(), torch.randn(8, 3, 16, 16)),
}


@dataclass
class CorrectnessRow:
    model: str
    budget: float
    partitioner: str
    max_error: float | None      # None when the step raised
    error: str                   # the exception, "" when it ran
    saved_bytes: int
    replayed: int                # random ops recomputed on the forward's RNG state
    rng_state_bytes: int         # saved for them
    replaced_bytes: int          # what saving their outputs (and masks) would have cost

    @property
    def correct(self) -> bool:
        return self.max_error is not None and self.max_error <= TOLERANCE


def _step(module: nn.Module, call: Callable, x: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(1234)
    out = call(x)
    out.float().pow(2).mean().backward()
    return ([out.detach()] + [p.grad for p in module.parameters()]
            + [b.detach().float() for b in module.buffers()])


def _replay_stats(fw: fx.GraphModule) -> tuple[int, int, int]:
    replays = [n for n in fw.graph.nodes if n.target is run_and_save_rng_state]
    state = sum(node_nbytes(u) for n in replays for u in n.users
                if u.args[1] == 0)  # getitem 0 is the state
    replaced = sum(node_nbytes(u) for n in replays for u in n.users if u.args[1] == 1)
    return len(replays), state, replaced


def run_case(label: str, budget: float, who: str) -> CorrectnessRow:
    torch.manual_seed(0)
    model, x = MODELS[label]()
    ref = _step(model_eager := copy.deepcopy(model), model_eager, x)
    seen: dict[str, Any] = {}

    def fw_compiler(gm: fx.GraphModule, _inputs: Any):
        seen["fw"] = gm
        return make_boxed_func(gm)

    def nop(gm: fx.GraphModule, _inputs: Any):
        return make_boxed_func(gm)

    def ours(joint, inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, **kwargs)
        seen["n"] = kwargs["num_fwd_outputs"]
        return fw, bw

    def theirs(joint, inputs, **kwargs):
        fw, bw = torch_min_cut_partition(joint, inputs, **kwargs)
        seen["n"] = kwargs["num_fwd_outputs"]
        return fw, bw

    compiled_model = copy.deepcopy(model)
    compiled = aot_module(compiled_model, fw_compiler=fw_compiler, bw_compiler=nop,
                          partition_fn=ours if who == "ours" else theirs)
    patch = (functorch_config.patch(activation_memory_budget=budget) if who == "ours"
             else torch_config.patch(activation_memory_budget=budget))
    try:
        with patch:
            got = _step(compiled_model, compiled, x)
        error, max_error = "", max(float((a - b).abs().max()) for a, b in zip(got, ref))
    except Exception as exc:  # a partitioner that crashes is a result too
        error, max_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}", None
    fw = seen.get("fw")
    saved = saved_activation_bytes(fw, seen["n"]) if fw is not None else 0
    replayed, state, replaced = _replay_stats(fw) if fw is not None else (0, 0, 0)
    return CorrectnessRow(label, budget, who, max_error, error, saved, replayed, state,
                          replaced)


def correctness_rows(models=tuple(MODELS), budgets=BUDGETS) -> list[CorrectnessRow]:
    return [run_case(label, budget, who) for label in models for budget in budgets
            for who in ("torch", "ours")]


def markdown(rows: list[CorrectnessRow]) -> str:
    lines = [
        "| model | budget | partitioner | correct | max error vs eager | saved bytes "
        "| replayed random ops | RNG state bytes | output+mask bytes replaced |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        err = r.error if r.max_error is None else f"{r.max_error:.3g}"
        lines.append(f"| {r.model} | {r.budget:g} | {r.partitioner} | "
                     f"{'yes' if r.correct else '**no**'} | {err} | {r.saved_bytes:,} | "
                     f"{r.replayed} | {r.rng_state_bytes:,} | {r.replaced_bytes:,} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(correctness_rows()))
