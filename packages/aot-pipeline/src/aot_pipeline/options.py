"""The pipeline's options, validated once, shared by ``compile()``, the back end and the CLI."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# The knapsack solvers aot_partition offers for the activation-memory budget (seed 000).
SOLVERS: tuple[str, ...] = ("dp", "greedy", "ilp", "ilp_graph", "dp_graph")
# "inductor" compiles forward and backward to Triton (CUDA) or C++ (CPU); the others are
# aot_compilers' graph compilers, run by name.
COMPILERS: tuple[str, ...] = ("inductor", "nop", "debug_nop", "print_compile", "ts_compile")


class PipelineOptionError(ValueError):
    """An option of the pipeline has a value it does not accept."""


@dataclass(frozen=True)
class PipelineOptions:
    """How the ``aot_pipeline`` back end partitions and compiles a graph.

    ``memory_budget`` is the fraction of the activations saved at budget 1.0 that the forward
    may keep for the backward (0.0 recomputes everything that can be recomputed); ``solver``
    picks the knapsack solver that decides what to recompute under that budget.
    """

    memory_budget: float = 1.0
    solver: str = "dp"
    compiler: str = "inductor"
    compiled_autograd: bool = False

    def __post_init__(self) -> None:
        validate_memory_budget(self.memory_budget)
        _validate_choice("solver", self.solver, SOLVERS)
        _validate_choice("compiler", self.compiler, COMPILERS)
        if not isinstance(self.compiled_autograd, bool):
            raise PipelineOptionError(
                f"compiled_autograd must be True or False, got {self.compiled_autograd!r}"
            )

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None, base: PipelineOptions) -> PipelineOptions:
        """``base`` with ``options`` (e.g. ``torch.compile(..., options=...)``) applied on top."""
        if not options:
            return base
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise PipelineOptionError(
                f"unknown aot_pipeline option(s) {', '.join(map(repr, unknown))}; "
                f"valid options are {', '.join(sorted(known))}"
            )
        return replace(base, **dict(options))


def validate_memory_budget(budget: object) -> float:
    """``budget`` as a float in [0, 1], or a PipelineOptionError that says what is valid."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise PipelineOptionError(
            f"memory_budget must be a number in [0, 1], got {budget!r} ({type(budget).__name__})"
        )
    if math.isnan(budget) or not 0.0 <= budget <= 1.0:
        raise PipelineOptionError(
            f"memory_budget must be in [0, 1] (1.0 saves every activation the min-cut keeps, "
            f"0.0 recomputes as much as possible), got {budget}"
        )
    return float(budget)


def _validate_choice(what: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise PipelineOptionError(f"unknown {what} {value!r}; choose one of {', '.join(valid)}")
