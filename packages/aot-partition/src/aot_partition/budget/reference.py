"""A fraction budget's reference check: never worse than the cut torch's estimator picks.

Two runtime estimators can choose different cuts at the same fraction (ours, ``roofline``,
against torch's ``flops``). Both cuts save at most the fraction's bytes, but either may peak
higher in the step or take longer: the knapsack sees neither the step's memory timeline nor
what a released node's recompute needs. So at a fraction strictly between 0 and 1, when the
call's estimator is not the reference (``PartitionConfig.reference_estimator``, the flag
``activation_memory_budget_reference_estimator``, default ``"flops"``), the search also makes
the reference estimator's cut. With ``PartitionConfig.reference_ilp`` (the flag
``activation_memory_budget_reference_ilp``, off by default) and the default "dp" solver on a
forward of at most ``ILP_CANDIDATE_MAX_NODES`` nodes it also makes the "ilp_graph" solver's cut
(HiGHS, at most ``ILP_CANDIDATE_TIME_LIMIT_S``; an answer not proven optimal in time is
dropped, so the result does not depend on the machine's speed). Opt-in because of its cost in
a cold compile: importing scipy.optimize takes 0.2 s of CPU and each solve 10-50 ms, which
made a whole cold compile of a 2-block Llama at 0.5 slower than Inductor's own (1.04, 0.98
without it; benchmarks/RESULTS-compile-time.md), for estimated steps up to 4% shorter.

When the cuts differ, each is simulated (memory_models/simulator.py: the step's absolute peak) and each step is
estimated with the call's estimator (``caps.step_estimate``). The answer is the candidate with
the least estimated step (then the least peak, then the search's own cut first) among those
no worse than the reference cut on both; the reference cut itself always qualifies.

Cost: one more knapsack (the cuts and bans are shared), a MILP on small graphs, and when the
answers differ one more cut and a simulation per distinct cut. Skipped where the answer is
known: when the search's cut came from a branch no runtime estimate decides (an escalation cut
that fits, no candidates), the reference search would return the same cut, so it is not run. At 0 and 1 the answer does not
depend on the estimator: no check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch.fx as fx

from .peak import CutMeasure, SimulatedPeak
from .search import BudgetSearch

log = logging.getLogger(__name__)

__all__ = ["ILP_CANDIDATE_MAX_NODES", "ILP_CANDIDATE_TIME_LIMIT_S", "CandidateScore",
           "ReferenceCheck", "check_against_reference"]

# The "ilp_graph" candidate is tried on forwards of at most this many MILP nodes, within this
# many seconds; read at call time (raise it to buy a better cut with compile time). HiGHS proved
# the optimum in 2-52 ms on every forward of up to 201 MILP nodes measured (the zoo, HF ViT,
# timm ViT), but took 70-320 ms on the 212-318-node forwards (HF GPT-2, Mixtral, Llama,
# ResNet-18s), more than torch's whole partition of those graphs (benchmarks/
# RESULTS-partition-fresh.notes.md has the table and what the candidate gained there).
ILP_CANDIDATE_MAX_NODES = 210
ILP_CANDIDATE_TIME_LIMIT_S = 2.0

# Estimates are sums of floats over different graphs: equal within this relative tolerance
# counts as equal, so a rounding difference does not decide.
_RELATIVE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class CandidateScore:
    """One candidate cut of the check and what it scored."""

    label: str            # "roofline", "flops", "roofline ilp_graph", ...
    peak_bytes: int       # simulated, absolute
    step_runtime: float   # estimated with the call's estimator


@dataclass(frozen=True)
class ReferenceCheck:
    """What the reference check compared, and what it took."""

    estimator: str                    # the call's estimator (whose cut is "ours")
    reference_estimator: str
    chosen: str                       # the label of the cut taken
    same_cut: bool                    # every candidate was the same saved set: nothing run
    scores: tuple[CandidateScore, ...] = ()   # distinct cuts, ours first, the reference second

    @property
    def kept_ours(self) -> bool:
        return self.chosen == self.estimator

    def describe(self) -> str:
        """One line for the report and the log."""
        if self.same_cut:
            return (f"reference check: the {self.reference_estimator} estimator chose the same "
                    "cut")
        scored = "; ".join(f"{s.label}: peak {s.peak_bytes} bytes, step {s.step_runtime:.6g}"
                           for s in self.scores)
        return (f"reference check: took the {self.chosen} cut ({scored}; steps estimated by "
                f"{self.estimator})")


def _no_worse(mine: CutMeasure, reference: CutMeasure) -> bool:
    """Peaks no higher and its step is estimated no longer (within rounding)."""
    assert mine.step_runtime is not None and reference.step_runtime is not None
    slack = _RELATIVE_TOLERANCE * max(abs(reference.step_runtime), abs(mine.step_runtime))
    return (mine.peak_bytes <= reference.peak_bytes
            and mine.step_runtime <= reference.step_runtime + slack)


def _ilp_candidate(search: BudgetSearch, memory_budget: float,
                   dp_answer: tuple[list[fx.Node], float]) -> list[fx.Node] | None:
    """The "ilp_graph" solver's cut, when asked for, the search uses "dp" and the MILP is small.
    ``dp_answer``: the search's own answer at this budget (the MILP's reference: not solved
    again)."""
    if (not search.config.reference_ilp or search.solver != "dp"
            or search.ilp_size() > ILP_CANDIDATE_MAX_NODES):
        return None
    exact = replace(search, solver="ilp_graph", ilp_time_limit_s=ILP_CANDIDATE_TIME_LIMIT_S,
                    ilp_optimal_only=True)
    return exact.saved_values(memory_budget, dp_answer=dp_answer)[0]


def _chosen_without_runtimes(search: BudgetSearch, memory_budget: float) -> bool:
    """True when ``search.saved_values(memory_budget)`` took a branch no runtime estimate
    decides (no range, an escalation cut that fits, no knapsack candidates), so a search under
    any other estimator returns the same cut. Only for the knapsack solvers: "ilp_graph"
    weighs runtimes even where "dp" escalates."""
    if search.solver == "ilp_graph":
        return False
    if not search.has_range:
        return True
    return (search.fits_more_aggressive(memory_budget) or search.fits_aggressive(memory_budget)
            or not search.has_candidates())


def check_against_reference(search: BudgetSearch, memory_budget: float, reference: str,
                            simulator: SimulatedPeak
                            ) -> tuple[list[fx.Node], float, ReferenceCheck | None]:
    """(saved values, recompute runtime, the check) at ``memory_budget``.

    ``simulator`` measures cuts of the search's joint with the search's estimator. The check
    is None when it does not apply: the budget is 0 or 1, or the estimators are the same. The
    runtime is the search's estimate for its own cut, else the simulator's recompute estimate.
    """
    saved, runtime = search.saved_values(memory_budget)
    if not 0 < memory_budget < 1 or reference == search.estimator:
        return saved, runtime, None
    if _chosen_without_runtimes(search, memory_budget):
        theirs = saved  # the reference search would take the same estimator-free branch
    else:
        theirs, _ = search.with_estimator(reference).saved_values(memory_budget)
    cuts: dict[frozenset[fx.Node], tuple[str, list[fx.Node]]] = {}
    cuts[frozenset(saved)] = (search.estimator, list(saved))
    cuts.setdefault(frozenset(theirs), (reference, list(theirs)))
    exact = _ilp_candidate(search, memory_budget, (list(saved), runtime))
    if exact is not None:
        cuts.setdefault(frozenset(exact), (f"{search.estimator} ilp_graph", list(exact)))
    if len(cuts) == 1:
        check = ReferenceCheck(search.estimator, reference, search.estimator, same_cut=True)
        log.info("memory budget %.3f: %s", memory_budget, check.describe())
        return saved, runtime, check
    assert simulator.estimator == search.estimator
    measured = [(label, cut, simulator.of(cut)) for label, cut in cuts.values()]
    baseline = simulator.of(theirs)
    qualified = [(m.step_runtime, m.peak_bytes, rank, label, cut)
                 for rank, (label, cut, m) in enumerate(measured) if _no_worse(m, baseline)]
    _, _, _, chosen, cut = min(qualified, key=lambda q: q[:3])
    scores = tuple(CandidateScore(label, m.peak_bytes, float(m.step_runtime or 0.0))
                   for label, _, m in measured)
    check = ReferenceCheck(search.estimator, reference, chosen, False, scores)
    log.info("memory budget %.3f: %s", memory_budget, check.describe())
    if chosen == search.estimator:
        return saved, runtime, check
    recompute = simulator.of(cut).recompute_runtime
    assert recompute is not None
    return cut, recompute, check
