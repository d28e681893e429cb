"""Which memory model prices a cut: the program Inductor compiles, or the FX graphs as they are.

- ``"inductor"`` (inductor.py): the buffers Inductor's compiled forward and backward
  allocate (fusion, in-place reuse, donated saved tensors, its memory plan), found by lowering
  the two graphs without compiling kernels. Exact against the profiler on CPU where measured
  (benchmarks/RESULTS-compiled-memory.md); a lowering costs about as much as Inductor's own
  lowering and scheduling of the graph (no kernel compile).
- ``"eager"`` (simulator.py): every FX node's output materialized, freed after its last use: the
  program nop, debug and TorchScript compilers run, and an upper bound of Inductor's.
- ``"auto"``: ``"inductor"`` when Inductor is the caller (its ``custom_partitioner_fn`` is set
  while it partitions), else ``"eager"``.

A graph Inductor cannot lower on its own falls back to the eager model, with a warning naming
the failure; ``Priced.model`` says which model priced a cut.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.fx as fx

from . import simulator as memory
from .inductor import InductorMemoryError, lower_partition

log = logging.getLogger(__name__)

__all__ = ["MEMORY_MODELS", "MemoryModelFallbackWarning", "Priced", "inductor_is_partitioning",
           "price_partition", "resolve_memory_model"]

MEMORY_MODELS = ("auto", "eager", "inductor")


class MemoryModelFallbackWarning(UserWarning):
    """The Inductor memory model could not lower a graph; the eager model priced it."""


def inductor_is_partitioning() -> bool:
    """Whether Inductor is compiling with a custom partitioner right now (ours, inside
    ``compile_fx``): its config patch is active while it partitions. Never imports Inductor."""
    config = sys.modules.get("torch._inductor.config")
    return config is not None and getattr(config, "custom_partitioner_fn", None) is not None


def resolve_memory_model(name: str) -> str:
    """``"eager"`` or ``"inductor"`` for a flag value (``"auto"`` decided now)."""
    if name not in MEMORY_MODELS:
        raise ValueError(f"unknown memory model {name!r}; choose one of "
                         f"{', '.join(MEMORY_MODELS)}")
    if name == "auto":
        return "inductor" if inductor_is_partitioning() else "eager"
    return name


@dataclass(frozen=True)
class Priced:
    """A cut's timeline and the model that made it (``fallback``: why not the one asked)."""

    timeline: memory.MemoryTimeline
    model: str
    fallback: str | None = None


def price_partition(fw: fx.Graph, bw: fx.Graph, model: str, *,
                    static_input_indices: Iterable[int] | None = None,
                    owner: torch.nn.Module | None = None, alignment: int = 1,
                    allocator: str | None = None, record_steps: bool = True) -> Priced:
    """The step's memory timeline under ``model`` (``"eager"`` or ``"inductor"``). The
    Inductor model counts what its extern kernels (convolutions, attention) allocate inside,
    measured once per op signature, on one rank; on many ranks it leaves them out, so every
    rank prices a cut the same (spmd.py: no measurement may differ between ranks).
    ``allocator="cuda"`` counts the CUDA caching allocator's blocks (memory.simulate_partition).
    ``record_steps=False``: the eager model keeps no per-step records (the peak only, as a
    search needs; memory.simulate_partition)."""
    if model == "inductor":
        from ..costs.spmd import multi_rank

        try:
            step = lower_partition(fw, bw, owner, workspace=not multi_rank())
            return Priced(step.timeline(static_input_indices=static_input_indices,
                                        alignment=alignment, allocator=allocator), "inductor")
        except InductorMemoryError as error:
            reason = str(error)
            message = f"{reason}; the eager (unfused) model prices this cut instead"
            log.warning("%s", message)
            warnings.warn(message, MemoryModelFallbackWarning, stacklevel=2)
            return Priced(memory.simulate_partition(
                fw, bw, static_input_indices=static_input_indices, alignment=alignment,
                allocator=allocator, workspace=memory.split_op_workspace,
                record_steps=record_steps), "eager", reason)
    if model != "eager":
        raise ValueError(f"price_partition: model must be 'eager' or 'inductor', got {model!r}")
    # The split's chunked ops hold one chunk's logits or intermediates inside: counted.
    return Priced(memory.simulate_partition(fw, bw, static_input_indices=static_input_indices,
                                            alignment=alignment, allocator=allocator,
                                            workspace=memory.split_op_workspace,
                                            record_steps=record_steps), "eager")
