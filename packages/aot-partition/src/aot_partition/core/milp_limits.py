"""How long one HiGHS MILP may run: a wall-clock limit on one process, a node limit (the same
deterministic work everywhere) when several ranks must reach the same answer."""

from __future__ import annotations

import math

__all__ = ["MILP_NODES_PER_SECOND", "milp_limits", "stopped_by_limit"]

# Branch-and-bound nodes allowed per second of the time limit under deterministic limits.
MILP_NODES_PER_SECOND = 200


def milp_limits(time_limit_s: float, *, deterministic: bool = False) -> dict[str, float | int]:
    """scipy ``milp`` options bounding one solve: ``time_limit_s`` seconds, or with
    ``deterministic`` ``MILP_NODES_PER_SECOND * time_limit_s`` branch-and-bound nodes (no
    limit for an infinite time limit)."""
    if not deterministic:
        return {"time_limit": time_limit_s}
    if not math.isfinite(time_limit_s):
        return {}
    return {"node_limit": max(1, round(MILP_NODES_PER_SECOND * time_limit_s))}


def stopped_by_limit(status: int, message: str) -> bool:
    """Whether scipy's ``milp`` stopped on a limit before proving optimality: status 1 (time
    or iteration limit), or HiGHS's "Solution limit reached" (its node limit), which scipy
    reports as status 4 with that text."""
    return status == 1 or (status == 4 and "limit reached" in message.lower())
