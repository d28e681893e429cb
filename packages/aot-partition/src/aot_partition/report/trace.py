"""A partition's decisions as ``TORCH_TRACE`` artifacts: pages in tlparse's report.

Under ``TORCH_TRACE`` (torch's structured trace) each partition writes these artifacts through
``torch._logging.trace_structured``, as torch's compiler writes its own (tlparse lists them
under the compile that ran the partition):

- ``aot_config.functorch`` (json): the flags in force, like torch's ``torch._functorch.config``
  page. Every savable ``aot_config.functorch`` flag, with the values the partition ran under
  for the flags it reads (``PartitionConfig.as_flags``: a ``config=`` argument wins).
- ``aot_partition_report`` (string): ``PartitionReport.format()``: partitioner, budget,
  solver, each saved and recomputed value with its reason, the bans, notes.
- ``aot_partition_decisions`` (json): the same as data, for tools.
- ``aot_partition_pareto`` (json): the memory-budget Pareto points and the PNG's path, only
  when the partition swept them (flag ``visualize_memory_budget_pareto``).

Without ``TORCH_TRACE`` nothing is built: ``tracing()`` checks torch's trace handler first,
and every payload is a function torch calls only when it writes the artifact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch._logging import _internal as torch_logging_internal
from torch._logging import trace_structured

from .report import PartitionReport

__all__ = ["ARTIFACT_NAMES", "trace_partition", "tracing"]

CONFIG_ARTIFACT = "aot_config.functorch"
REPORT_ARTIFACT = "aot_partition_report"
DECISIONS_ARTIFACT = "aot_partition_decisions"
PARETO_ARTIFACT = "aot_partition_pareto"
ARTIFACT_NAMES = (CONFIG_ARTIFACT, REPORT_ARTIFACT, DECISIONS_ARTIFACT, PARETO_ARTIFACT)


def tracing() -> bool:
    """Whether torch's structured trace is on (``TORCH_TRACE`` set, or a handler added).

    The same test ``trace_structured`` makes: its logger never propagates, so it has
    handlers exactly when something writes the trace."""
    return bool(torch_logging_internal.trace_log.handlers)


def trace_partition(partitioner: str, report_fn: Callable[[], PartitionReport]) -> None:
    """Write one partition's artifacts when tracing; ``report_fn`` is called only then."""
    if not tracing():
        return
    report = report_fn()
    _artifact(CONFIG_ARTIFACT, "json", lambda: config_page(report))
    _artifact(REPORT_ARTIFACT, "string",
              lambda: f"partitioner: {partitioner}\n{report.format()}\n")
    _artifact(DECISIONS_ARTIFACT, "json", lambda: decisions_page(partitioner, report))
    if report.pareto_points:
        _artifact(PARETO_ARTIFACT, "json", lambda: pareto_page(report))


def _artifact(name: str, encoding: str, payload_fn: Callable[[], Any]) -> None:
    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding},
                     payload_fn=payload_fn)


def config_page(report: PartitionReport) -> dict[str, Any]:
    """The ``aot_config.functorch`` flags, those the partition read as it read them."""
    from aot_config import functorch as functorch_flags

    flags = functorch_flags.save_config_portable()
    if report.config is not None:
        flags.update(report.config.as_flags())
    return flags


def decisions_page(partitioner: str, report: PartitionReport) -> dict[str, Any]:
    check = report.reference_check
    return {
        "partitioner": partitioner,
        "budget": report.given_budget.as_dict(),
        "memory_budget": report.memory_budget,
        "memory_budget_bytes": report.memory_budget_bytes,
        "activation_bytes": report.activation_bytes,
        "peak_bytes": report.peak_bytes,
        "simulated_peak_bytes": report.simulated_peak_bytes,
        "memory_model": report.memory_model,
        "solver": report.solver,
        "saved_bytes": report.saved_bytes,
        "active_rules": list(report.active_rules),
        "reference_check": check.describe() if check is not None else None,
        "saved": [dataclasses.asdict(d) for d in report.saved],
        "recomputed": [dataclasses.asdict(d) for d in report.recomputed],
        "banned": dict(report.banned),
        "notes": list(report.notes),
    }


def pareto_page(report: PartitionReport) -> dict[str, Any]:
    return {"png": report.pareto_png,
            "points": [dataclasses.asdict(p) for p in report.pareto_points]}
