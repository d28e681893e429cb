"""Whole training steps (the loss inside the compiled region) compiled by aot_pipeline, with the
partitions as the partitioner returned them, and their measured peak: what the memory-model
tests compare predictions with."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LanguageModelStep:
    """A tiny GPT and a batch of token ids; ``step(ids, labels)`` returns the loss."""

    module: nn.Module
    batch: tuple[torch.Tensor, ...]

    def step(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.module(ids)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def tiny_gpt(vocab: int = 256, dim: int = 64, layers: int = 1, seq: int = 64,
             batch: int = 4, device: str = "cpu") -> LanguageModelStep:
    from aot_pipeline.models import build_model

    module = build_model("gpt", vocab=vocab, dim=dim, heads=4, layers=layers, seq=seq,
                         device=device).module
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    return LanguageModelStep(module, (ids, ids.clone()))


class ClassifierStep(LanguageModelStep):
    """An image classifier and a batch of images and labels; ``step(x, y)`` returns the loss."""

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return F.cross_entropy(self.module(x), y)


def wide_convnet(width: int = 256, batch: int = 4, side: int = 4) -> ClassifierStep:
    """Three 3x3 convolutions of ``width`` channels on small images: weights larger than the
    activations, so oneDNN's convolution backward (grad weight plus a weight-size scratch)
    makes the step's peak."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))
    g = torch.Generator().manual_seed(1)
    return ClassifierStep(net, (torch.randn(batch, 3, side, side, generator=g),
                                torch.randint(0, 10, (batch,), generator=g)))


@dataclass
class CompiledStep:
    """A step compiled by aot_pipeline, keeping a copy of each partition as the partitioner
    returned it (Inductor rewrites the graphs it compiles)."""

    model: LanguageModelStep
    compiled: Any
    partitions: list[tuple[Any, Any]] = field(default_factory=list)

    def run(self) -> torch.Tensor:
        self.clear_grads()
        return self._step()

    def clear_grads(self) -> None:
        for p in self.model.module.parameters():
            p.grad = None

    def _step(self) -> torch.Tensor:
        loss = self.compiled(*self.model.batch)
        loss.backward()
        return loss

    def measure(self, device: str = "cpu") -> Any:
        """A step's peak above the memory allocated before it (MeasuredMemory). The last
        step's gradients are dropped before, not inside, the measured step: their frees
        would lower what it measures."""
        from aot_partition.memory_models.simulator import measure_peak

        self.clear_grads()
        return measure_peak(self._step, device)


def compile_step(model: LanguageModelStep, memory_budget: float | str = 1.0,
                 **options: Any) -> CompiledStep:
    """``aot_pipeline.compile(model.step, memory_budget=...)``, run once (it compiles)."""
    import aot_pipeline

    torch._dynamo.reset()
    compiled = aot_pipeline.compile(model.step, memory_budget=memory_budget, **options)
    result = CompiledStep(model, compiled)
    record: Callable[..., None] = compiled.recorder.record_forward

    def keep_copy(forward: Any, backward: Any = None, *args: Any, **kwargs: Any) -> None:
        result.partitions.append((copy.deepcopy(forward), copy.deepcopy(backward)))
        record(forward, backward, *args, **kwargs)

    compiled.recorder.record_forward = keep_copy
    result.run()
    return result
