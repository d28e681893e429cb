"""Several memory budgets in one graph: each region's saved bytes held to its own budget.

The forward is split into groups: one per region (regions.py), and the rest (every forward
node in no region, the graph inputs included) under the global fraction. A group's measure is
the bytes its saved values the backward reads keep alive, in the one measure
(``sizes.saved_buffers``, as ``caps.activation_bytes`` counts them: graph inputs and views of
them are alive anyway and count nothing; a buffer counts once, in the group of the first
saved value holding it). Its limit is its byte cap, or for a fraction
``f``: ``least + f * (runtime_optimal - least)``, where ``runtime_optimal`` is the group's
bytes in the runtime-optimal cut and ``least`` its bytes when every constrained group
recomputes all it can. The rest at fraction 1.0 is not constrained (nothing was asked of it).

All groups share one min-cut network, cut under the call's ban options: a group spends its
budget by keeping some of its banned nodes banned (saved) and releasing the others
(``dont_ban``). Each constrained group solves its own knapsack over its banned nodes
(``budget.recompute_candidates``) with capacity ``limit - least``; one cut is taken with every
group's releases. Releasing a node lets the cut save its inputs instead, possibly in another
group, so while a group is over its limit its kept items of least runtime per byte are
released too (enough to cover the excess) and the cut is taken again. If that does not
converge, the cut with every constrained group's items released is taken: every fractional
limit holds there by construction; a byte cap that does not raises
``UnreachableMemoryBudgetError`` naming the region and the least it can save.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.fx as fx

from ..core.knapsack import KNAPSACK_SOLVERS, get_knapsack_solver
from ..costs.estimators import estimate_runtime
from ..errors import UnreachableMemoryBudgetError
from ..fx.regions import RegionBudget, Regions
from ..fx.sizes import saved_buffers
from .search import (
    BudgetSearch,
    needed_by_backward,
    recompute_candidates,
    recompute_savings,
)

log = logging.getLogger(__name__)

__all__ = ["RegionOutcome", "choose_with_regions"]

# Cuts taken repairing over-budget groups before falling back to the least cut.
MAX_REPAIR_ROUNDS = 16
# Cuts spent afterwards banning released items again while every group still fits.
MAX_REFILL_CUTS = 8


@dataclass(frozen=True)
class RegionOutcome:
    """What one group's budget allowed and what its cut saved (the partition report's rows)."""

    label: str                   # "region 0.25", "region 65536 bytes", "rest (global 1)"
    budget: RegionBudget
    forward_nodes: int           # forward nodes in the group
    limit_bytes: int | None      # None: not constrained (the rest at fraction 1.0)
    saved_bytes: int             # what the chosen cut saves of the group (backward-read)
    least_bytes: int             # the group's bytes when the constrained groups recompute all
    runtime_optimal_bytes: int   # the group's bytes in the runtime-optimal cut

    @property
    def met(self) -> bool:
        return self.limit_bytes is None or self.saved_bytes <= self.limit_bytes

    def describe(self) -> str:
        limit = "no limit" if self.limit_bytes is None else f"limit {self.limit_bytes}"
        return (f"{self.label}: saved {self.saved_bytes} bytes ({limit}; runtime-optimal "
                f"{self.runtime_optimal_bytes}, least {self.least_bytes}; "
                f"{self.forward_nodes} forward nodes)")


@dataclass
class _Group:
    label: str
    budget: RegionBudget
    members: int
    constrained: bool
    items: list[fx.Node]
    limit: int = 0
    least: int = 0
    optimal: int = 0


class _Measure:
    """Bytes each group saves in a cut (cached by saved set): the one measure
    (``sizes.saved_buffers``), each buffer charged once, to the group of the first saved
    value holding it (a saved view counts in its own region, as torch's region budgets
    count saved nodes)."""

    def __init__(self, search: BudgetSearch, group_of: dict[fx.Node, int], rest: int,
                 groups: int) -> None:
        self.search, self.group_of, self.rest, self.groups = search, group_of, rest, groups
        self._cache: dict[frozenset[fx.Node], list[int]] = {}

    def __call__(self, saved: list[fx.Node]) -> list[int]:
        key = frozenset(saved)
        if key not in self._cache:
            totals = [0] * self.groups
            for holder, nbytes in saved_buffers(needed_by_backward(self.search, saved)).values():
                totals[self.group_of.get(holder, self.rest)] += nbytes
            self._cache[key] = totals
        return self._cache[key]


def _groups(search: BudgetSearch, regions: Regions, global_budget: float
            ) -> tuple[list[_Group], dict[fx.Node, int]]:
    """One group per region (in graph order) and the rest last; and each node's group (nodes
    in no region: the rest, not listed)."""
    order = list(regions.nodes)
    group_of = {node: i for i, budget in enumerate(order) for node in regions.nodes[budget]}
    solution = search.solution_for(search.runtime_optimal)
    banned = list(solution.banned) if solution is not None else []
    _, items = recompute_candidates(search.node_info, banned, search.options)
    groups = [_Group(f"region {budget.label}", budget, len(regions.nodes[budget]), True,
                     [n for n in items if group_of.get(n) == i])
              for i, budget in enumerate(order)]
    rest_members = len(regions.unannotated_forward_ops)
    groups.append(_Group(f"rest (global {global_budget:g})", RegionBudget(global_budget),
                         rest_members, global_budget < 1.0,
                         [n for n in items if n not in group_of]))
    return groups, group_of


def _knapsack_releases(group: _Group, solver: str, estimator: str) -> set[fx.Node]:
    """The group's items to release: a knapsack keeps those worth their bytes within
    ``limit - least``."""
    if not group.items:
        return set()
    room = group.limit - group.least
    if room <= 0:
        return set(group.items)
    savings = [recompute_savings(n) for n in group.items]
    scale = float(max(room, sum(savings), 1))
    runtimes = [estimate_runtime(n, estimator) for n in group.items]
    _, _, recompute = get_knapsack_solver(solver)([s / scale for s in savings], runtimes,
                                                  room / scale)
    return {group.items[i] for i in recompute}


def _release_for_excess(group: _Group, released: set[fx.Node], excess: int,
                        estimator: str) -> bool:
    """Release the group's kept items of least runtime per byte, enough bytes to cover
    ``excess``; False when none is left to release."""
    kept = [n for n in group.items if n not in released]
    if not kept:
        return False
    kept.sort(key=lambda n: estimate_runtime(n, estimator) / max(recompute_savings(n), 1))
    freed = 0
    for node in kept:
        released.add(node)
        freed += recompute_savings(node)
        if freed >= excess:
            break
    return True


def _refill(search: BudgetSearch, groups: list[_Group], measure: _Measure,
            saved: list[fx.Node], released: set[fx.Node]) -> list[fx.Node]:
    """Ban released items again, most runtime per byte first, while every constrained group
    still fits (a release may have freed more than its group needed); ``released`` shrinks
    in place. At most ``MAX_REFILL_CUTS`` cuts."""
    totals = measure(saved)
    room = {id(g): g.limit - totals[i] for i, g in enumerate(groups) if g.constrained}
    tries = sorted(
        (n for g in groups if g.constrained and room[id(g)] > 0 for n in g.items
         if n in released and recompute_savings(n) <= room[id(g)]),
        key=lambda n: -estimate_runtime(n, search.estimator) / max(recompute_savings(n), 1))
    for node in tries[:MAX_REFILL_CUTS]:
        trial = released - {node}
        cut, _ = search.solve(search.options, trial)
        totals = measure(cut)
        if all(totals[i] <= g.limit for i, g in enumerate(groups) if g.constrained):
            released.discard(node)
            saved = cut
    return saved


def choose_with_regions(search: BudgetSearch, regions: Regions, global_budget: float
                        ) -> tuple[list[fx.Node], float, list[RegionOutcome]]:
    """(saved values, estimated runtime of the released items, one outcome per group)."""
    groups, group_of = _groups(search, regions, global_budget)
    measure = _Measure(search, group_of, len(groups) - 1, len(groups))
    constrained = [g for g in groups if g.constrained]
    all_items = {n for g in constrained for n in g.items}
    least_cut, _ = search.solve(search.options, all_items)
    least, optimal = measure(least_cut), measure(search.runtime_optimal)
    for i, group in enumerate(groups):
        group.least, group.optimal = least[i], optimal[i]
        if group.budget.nbytes is not None:
            group.limit = group.budget.nbytes
        else:
            assert group.budget.fraction is not None
            span = max(group.optimal - group.least, 0)
            group.limit = group.least + int(group.budget.fraction * span)
    solver = search.solver if search.solver in KNAPSACK_SOLVERS else "dp"
    released: set[fx.Node] = set()
    for group in constrained:
        released |= _knapsack_releases(group, solver, search.estimator)
    saved: list[fx.Node] | None = None
    for _ in range(MAX_REPAIR_ROUNDS):
        cut, _ = search.solve(search.options, released)
        totals = measure(cut)
        over = [(i, g) for i, g in enumerate(groups) if g.constrained and totals[i] > g.limit]
        if not over:
            saved = cut
            break
        progress = [_release_for_excess(g, released, totals[i] - g.limit, search.estimator)
                    for i, g in over]
        if not any(progress):
            break
    if saved is None:
        log.info("region budgets: repairs did not converge; every region recomputes all it can")
        for i, group in enumerate(groups):
            if group.constrained and least[i] > group.limit:
                raise UnreachableMemoryBudgetError(
                    f"{group.label} memory budget", group.limit, least[i],
                    "recompute everything in the regions")
        saved, released = least_cut, set(all_items)
    else:
        saved = _refill(search, groups, measure, saved, released)
    totals = measure(saved)
    outcomes = [RegionOutcome(g.label, g.budget, g.members, g.limit if g.constrained else None,
                              totals[i], g.least, g.optimal) for i, g in enumerate(groups)]
    runtime = float(sum(estimate_runtime(n, search.estimator) for n in released))
    for outcome in outcomes:
        log.info("region budgets: %s", outcome.describe())
    return list(saved), runtime, outcomes
