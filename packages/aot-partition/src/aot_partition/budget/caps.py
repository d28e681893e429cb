"""Caps: choosing one of the fixed candidate cuts (candidates.py) under a limit.

A budget in bytes (``activation_memory_budget_bytes``, ``within_bytes``) takes the best
candidate whose ``activation_bytes`` fit (``choose_candidate``); a cap on the modelled peak
(``activation_memory_peak_bytes``, ``peak_cap``) takes the same rule with the peak
(peak.py's ``SimulatedPeak``) as the measure and the fitting candidates ordered by the estimated
step; ``within_caps`` takes both at once. Candidates are priced lazily, only when a cap is set
and only until one fits."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import _moved
from ..errors import UnreachableMemoryBudgetError
from .candidates import CutCandidate, Measure, activation_bytes, candidate, cut_candidates
from .peak import INDUCTOR_PRICINGS, SimulatedPeak
from .search import BudgetSearch

log = logging.getLogger(__name__)

__all__ = [
    "Cap",
    "byte_cap",
    "choose_candidate",
    "choose_under_caps",
    "least_measure",
    "peak_cap",
    "validate_memory_budget_bytes",
    "validate_peak_bytes",
    "within_bytes",
    "within_caps",
]


def validate_memory_budget_bytes(cap: int) -> int:
    """``cap`` as an int; ValueError unless it is a whole number of bytes, 0 or more."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ValueError(f"activation memory budget in bytes must be an int >= 0; got {cap!r}")
    return cap


def validate_peak_bytes(cap: int) -> int:
    """``cap`` as an int; ValueError unless it is a whole number of bytes, 0 or more."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ValueError(f"activation memory peak in bytes must be an int >= 0; got {cap!r}")
    return cap


def choose_candidate(candidates: Sequence[CutCandidate], cap: int, measure: Measure, *,
                     what: str = "activation memory budget", verb: str = "save",
                     runtime: Callable[[CutCandidate], float] | None = None,
                     lower_bound: Measure | None = None,
                     max_measured: int | None = None) -> CutCandidate:
    """The candidate to take under ``cap``: among those whose ``measure`` is at most ``cap``,
    the runtime-optimal cut (rank 0) when it fits, else the least runtime (``runtime(c)``,
    default ``c.runtime``), then the smaller measure, then the lower rank.

    The runtime-optimal cut comes first whatever its estimate: its bans are the heuristics'
    judgement of what is slow to recompute, which the runtime estimate does not see (the
    escalation cuts lift those bans at an estimated runtime of 0). The candidates and their
    order do not depend on the cap, so the rule is monotone by construction: if the answer
    under a higher cap still fits a lower one it stays the answer, and otherwise the new answer
    measures at most the lower cap, below the old one. When nothing fits,
    UnreachableMemoryBudgetError names the cap and the least reachable measure (``what`` and
    ``verb`` word it).

    Candidates are measured lazily, in the order of preference, until the first that fits (and
    its equals in runtime): a costly measure (the Inductor memory model lowers two graphs) is
    paid for few of them. ``lower_bound(c)`` (cheap; at most ``measure(c)``, or an estimate)
    skips a candidate it puts over the cap, and bounds the search for the least measure when
    none fits. ``max_measured`` bounds a costly search: after that many candidates measured in
    the order of preference without a fit, that many more are measured in the order of
    ``lower_bound`` (the likeliest to fit first) and the first that fits is taken; when none
    does, the error names the least of those measured.
    """
    runtime_of = runtime if runtime is not None else (lambda c: c.runtime)
    order = sorted(candidates, key=lambda c: (c.rank != 0, runtime_of(c), c.rank))
    measured: dict[int, int] = {}

    def measure_of(c: CutCandidate) -> int:
        if c.rank not in measured:
            measured[c.rank] = measure(c)
        return measured[c.rank]

    best: tuple[int, int, CutCandidate] | None = None
    best_key: tuple[bool, float] | None = None
    for c in order:
        key = (c.rank != 0, runtime_of(c))
        if best_key is not None and key != best_key:
            break
        if best is None and max_measured is not None and len(measured) >= max_measured:
            break
        if lower_bound is not None and lower_bound(c) > cap:
            continue
        m = measure_of(c)
        if m <= cap and (best is None or (m, c.rank) < best[:2]):
            best, best_key = (m, c.rank, c), key
    if best is not None:
        return best[2]
    if max_measured is not None:
        bound = lower_bound if lower_bound is not None else (lambda c: 0)
        rest = sorted((c for c in candidates if c.rank not in measured),
                      key=lambda c: (bound(c), c.rank))
        for c in rest[:max_measured]:
            if measure_of(c) <= cap:
                return c
        least = min((c for c in candidates if c.rank in measured),
                    key=lambda c: (measured[c.rank], c.rank))
        label = least.label
        if len(measured) < len(candidates):
            label += (f"; the least of the {len(measured)} of {len(candidates)} candidate cuts "
                      "priced, the others estimated higher")
        raise UnreachableMemoryBudgetError(what, cap, measured[least.rank], label, verb)
    least, amount = least_measure(candidates, measure_of, lower_bound)
    if amount <= cap:  # a candidate the bound skipped fits after all: the one found
        return least
    raise UnreachableMemoryBudgetError(what, cap, amount, least.label, verb)


def least_measure(candidates: Sequence[CutCandidate], measure: Measure,
                  lower_bound: Measure | None = None) -> tuple[CutCandidate, int]:
    """The candidate with the least ``measure`` (then the lower rank); with ``lower_bound``,
    candidates whose bound is above the least found so far are not measured."""
    bound = lower_bound if lower_bound is not None else (lambda c: 0)
    best: tuple[int, int, CutCandidate] | None = None
    for c in sorted(candidates, key=lambda c: (bound(c), c.rank)):
        if best is not None and bound(c) > best[0]:
            break
        m = measure(c)
        if best is None or (m, c.rank) < best[:2]:
            best = (m, c.rank, c)
    assert best is not None, "least_measure: no candidates"
    return best[2], best[0]


@dataclass(frozen=True)
class Cap:
    """One cap a candidate must meet: ``measure(candidate) <= limit``; ``what`` and ``verb``
    word the error when nothing does (see ``choose_candidate``)."""

    limit: int
    measure: Measure
    what: str = "activation memory budget"
    verb: str = "save"
    # How the fitting candidates are ordered when this cap chooses (default: their runtime).
    runtime: Callable[[CutCandidate], float] | None = None
    # A cheap lower bound of ``measure`` (see choose_candidate); None: none.
    lower_bound: Measure | None = None
    # How many candidates a costly measure may price in each phase (choose_candidate).
    max_measured: int | None = None


def byte_cap(search: BudgetSearch, limit: int) -> Cap:
    """The cap on saved activation bytes (``activation_bytes``)."""
    return Cap(validate_memory_budget_bytes(limit), functools.partial(activation_bytes, search))


def peak_cap(limit: int, peak: SimulatedPeak, *, after_byte_cap: bool = False,
             search: BudgetSearch | None = None) -> Cap:
    """The cap on the modelled peak; ``after_byte_cap``: it only sees the candidates within a
    byte cap, which its error then says. With ``search``, a candidate's inputs plus its saved
    activations (all alive when the forward returns) bound its peak from below."""
    verb = "peak at within the activation memory budget" if after_byte_cap else "peak at"
    # The simulation also estimates the whole step: a better order than the knapsack items'
    # runtime, which misses what a cut's recompute needs and what the forward no longer runs.
    runtime = peak.step_runtime if peak.estimator is not None else None
    bound = None
    if search is not None:
        def bound(c: CutCandidate) -> int:
            return max(peak.input_bytes + activation_bytes(search, c), peak.soft_bound(c.saved))
    # The Inductor model lowers two graphs per cut: its search is bounded.
    limit_measured = INDUCTOR_PRICINGS if peak.model == "inductor" else None
    return Cap(validate_peak_bytes(limit), peak, f"{peak.model_words} peak cap", verb, runtime,
               bound, limit_measured)


def _within(candidates: Sequence[CutCandidate], cap: Cap) -> list[CutCandidate]:
    """The candidates that fit ``cap``; UnreachableMemoryBudgetError when none does."""
    bound = cap.lower_bound
    fitting = [c for c in candidates
               if (bound is None or bound(c) <= cap.limit) and cap.measure(c) <= cap.limit]
    if not fitting:
        least, amount = least_measure(candidates, cap.measure, bound)
        raise UnreachableMemoryBudgetError(cap.what, cap.limit, amount, least.label, cap.verb)
    return fitting


def choose_under_caps(candidates: Sequence[CutCandidate], caps: Sequence[Cap]) -> CutCandidate:
    """``choose_candidate`` under several caps: every cap but the last filters the candidates
    (in order, so a cheap measure spares the costly ones), the last chooses among the rest.

    Still monotone in each cap: the candidates and their order are fixed, so lowering a cap
    only removes candidates, and an answer that still fits stays the answer.
    """
    remaining: Sequence[CutCandidate] = candidates
    for cap in caps[:-1]:
        remaining = _within(remaining, cap)
    last = caps[-1]
    return choose_candidate(remaining, last.limit, last.measure, what=last.what, verb=last.verb,
                            runtime=last.runtime, lower_bound=last.lower_bound,
                            max_measured=last.max_measured)


def within_bytes(search: BudgetSearch, cap: int, measure: Measure | None = None
                 ) -> CutCandidate:
    """The cut to take under a cap on ``measure`` (default ``activation_bytes``).

    The runtime-optimal cut comes first among all candidates, so when it fits no other
    cut is made: an ample cap costs nothing. See ``choose_candidate``.
    """
    cap = validate_memory_budget_bytes(cap)
    if measure is None:
        return within_caps(search, [byte_cap(search, cap)])
    return within_caps(search, [Cap(cap, measure)])


def within_caps(search: BudgetSearch, caps: Sequence[Cap]) -> CutCandidate:
    """The cut to take under every cap of ``caps`` (see ``choose_under_caps``).

    The runtime-optimal cut is measured first: when it fits every cap no other candidate
    is made or measured, so ample caps cost one measurement each.
    """
    if not caps:
        raise ValueError("within_caps: no cap given")
    top = candidate(search, search.runtime_optimal, "runtime-optimal", 0)
    if all(cap.measure(top) <= cap.limit for cap in caps):  # short-circuits: cheap first
        return top
    return choose_under_caps(cut_candidates(search), caps)


# Names this module held before the rooms (aot_partition.budget.caps.<name>) and no longer
# uses: found at their new homes, with a DeprecationWarning, until 0.3. (The candidates and
# SimulatedPeak, which the caps use, are still importable from here.)
__getattr__ = _moved.moved_names(__name__, {
    "BYTE_BUDGET_FRACTIONS": "budget.candidates",
    "CutMeasure": "budget.peak", "KEPT_CUT_GRAPHS": "budget.peak",
    "SOFT_BOUND_MARGIN": "budget.peak",
    "CutGraphs": "fx.cut", "split_saved": "fx.cut", "extract_cut": "fx.cut",
    "finish_cut": "fx.cut",
    "NodeEstimates": "costs.cut_runtime", "recompute_estimate": "costs.cut_runtime",
    "step_estimate": "costs.cut_runtime",
})
