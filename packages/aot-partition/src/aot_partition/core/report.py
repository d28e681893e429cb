"""What a budgeted partition did, per node, in the core's words (no fx vocabulary).

``core_report`` (what ``budget.BudgetedPartition.report()`` calls) builds a ``CoreReport``: the
budget that was given, the candidate cut chosen, its saved bytes, simulated peak and recompute
runtime, and one row per node (saved, recomputed, forward or backward, the ban it had, and why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .graph import RECOMPUTED, CoreDecision, CorePartition

__all__ = ["CoreReport", "core_report"]


@dataclass(frozen=True)
class CoreReport:
    budget: str                 # the budget that was given, in words
    chosen: str                 # the candidate cut taken ("runtime-optimal", "budget 0.5", ...)
    saved_bytes: int
    peak_bytes: int
    recompute_runtime: float
    nodes: tuple[CoreDecision, ...]  # one per node, the budget's lifted bans named

    def by_kind(self, kind: str) -> tuple[str, ...]:
        """Ids of the nodes of one kind, in graph order."""
        return tuple(row.id for row in self.nodes if row.kind == kind)

    def format(self) -> str:
        lines = [f"{self.budget}: took the {self.chosen} cut; saves {self.saved_bytes} bytes, "
                 f"simulated peak {self.peak_bytes} bytes, recompute runtime "
                 f"{self.recompute_runtime:g}"]
        lines += [f"  {row.id}: {row.reason}" for row in self.nodes]
        return "\n".join(lines)


def core_report(result: CorePartition, *, budget: str, chosen: str, saved_bytes: int,
                peak_bytes: int, recompute_runtime: float,
                released: Mapping[str, str]) -> CoreReport:
    """The report of ``result``; ``released``: id -> the ban the budget lifted."""
    rows = []
    for node_id, decision in result.decisions.items():
        reason, ban = decision.reason, decision.ban
        lifted = released.get(node_id)
        if lifted is not None:
            ban = lifted
            if decision.kind == RECOMPUTED:
                reason = f"recomputed in backward: the budget lifted its ban ({lifted})"
        rows.append(CoreDecision(node_id, decision.kind, reason, ban))
    return CoreReport(budget, chosen, saved_bytes, peak_bytes, recompute_runtime, tuple(rows))
