"""The "ilp_graph" budget solver: save-or-recompute for the whole forward as one MILP (HiGHS).

It works on arrays (``SaveOrRecompute``), not on fx nodes: ``budget.py`` describes the forward
graph with them and reads the answer back. Variables, per forward node v (not an input):
``save[v]`` and ``recompute[v]`` in {0, 1}; per graph input u: ``keep[u]`` (saved for the
backward, needed when the backward or a recomputed node reads it).

- every forward node that a backward node reads is available: save + recompute >= 1;
- recomputing v needs each forward input u available: save[u] + recompute[u] >= recompute[v]
  (a graph input read by a recomputed node must be kept);
- nodes the aggressive policy still bans, other than the knapsack candidates, are never
  recomputed; nodes whose value is not a tensor or a symbolic scalar (a tuple-valued
  ``native_layer_norm``: its ``getitem`` outputs are saved instead) are never saved;
- saved bytes fit the budget: sum(bytes * save) + sum(bytes * keep) <= min_bytes + budget *
  (max_bytes - min_bytes), the memory ratio of the other solvers, and no more than the "dp"
  solver's answer saves (so the result is never worse than it on memory);
- minimize the estimated runtime of what is recomputed; ties go to fewer saved bytes, then to
  fewer recomputed nodes (see ``_lexicographic_costs``).

Unlike the knapsack solvers, it accounts for what recomputing a node needs, and it returns the
saved values directly (no final min cut).

Robustness: the solve is bounded by ``time_limit_s`` (default ``ILP_GRAPH_TIME_LIMIT_S``, 10 s,
read at call time); on time-out HiGHS's best feasible answer is used and its optimality gap
reported (``SaveOrRecomputeAnswer.mip_gap``, ``.time_limited``, ``.status``, and a log line).
scipy's ``milp`` takes no initial solution, so instead of a warm start a ``reference`` answer
(``evaluate`` of the "dp" solver's saved set) competes with the MILP's: the one with less
recompute runtime, then fewer saved bytes, wins among those within the capacity. The MILP's
answer is re-evaluated the same way (``evaluate``: the least recomputation its saved set needs),
so the two are compared on one measure and HiGHS's rounding tolerance cannot leak into it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .milp_limits import milp_limits, stopped_by_limit
from .sparse_rows import LowerBoundRows

log = logging.getLogger(__name__)

__all__ = ["ILP_GRAPH_TIME_LIMIT_S", "SaveOrRecompute", "SaveOrRecomputeAnswer", "evaluate",
           "fits", "recompute_work", "solve_save_or_recompute"]

# Seconds HiGHS may spend on one solve (read at call time: set it to change the default).
ILP_GRAPH_TIME_LIMIT_S = 10.0


def recompute_work(runtimes: np.ndarray, estimator: str) -> np.ndarray:
    """The runtimes the solver minimizes: as estimated, except that under "flops" an op without
    a FLOP formula (estimate 1) is free, as the knapsack's FLOP totals treat it."""
    runtimes = np.asarray(runtimes, dtype=np.float64)
    return np.where(runtimes > 1, runtimes, 0.0) if estimator == "flops" else runtimes.copy()


def _lexicographic_costs(runtimes: np.ndarray, sizes: np.ndarray, estimator: str
                         ) -> tuple[np.ndarray, np.ndarray]:
    # runtimes: one per forward node; sizes: forward nodes, then graph inputs.
    """Objective weights: recompute work first, then saved bytes, then recomputed node count.

    With the "flops" estimator, ops without a FLOP formula (estimate 1) count as no work, so
    among answers with the least FLOPs the one saving the fewest bytes wins. Work is measured
    in units of the smallest positive estimate: roofline seconds (around 1e-6) would otherwise
    sit below HiGHS's absolute gap tolerance (1e-6) and stop it percent away from the optimum.
    """
    work = recompute_work(runtimes, estimator)
    positive = work[work > 0]
    unit = float(positive.min()) if positive.size else 1.0
    work = work / unit
    # All bytes together weigh less than the smallest unit of work ...
    save_cost = 0.5 * sizes / max(float(sizes.sum()), 1.0)
    positive_bytes = save_cost[save_cost > 0]
    # ... and all recomputed nodes together less than the smallest saved tensor.
    per_node = 0.5 * (float(positive_bytes.min()) if positive_bytes.size else 1.0) / len(sizes)
    return save_cost, work + per_node


@dataclass(frozen=True)
class SaveOrRecompute:
    """The problem: ``n`` forward nodes (indices 0..n-1) and ``m`` graph inputs (n..n+m-1)."""

    sizes: np.ndarray              # float64 [n + m]: bytes of each forward node, then input
    runtimes: np.ndarray           # float64 [n]: estimated cost of recomputing each node
    read_by_backward: np.ndarray   # bool [n + m]: a backward node reads it
    recomputable: np.ndarray       # bool [n]: the policy allows recomputing it
    reads: Sequence[Sequence[int]]  # reads[v]: the nodes and inputs v reads, in argument order
    capacity: float                # saved bytes allowed (forward nodes and kept inputs)
    estimator: str                 # the runtime estimator (weighs ops without FLOPs as free)
    savable: np.ndarray | None = None  # bool [n]: the value can be saved (None: every node)

    @property
    def num_forward(self) -> int:
        return int(self.runtimes.shape[0])

    def savable_mask(self) -> np.ndarray:
        n = self.num_forward
        return np.ones(n, dtype=bool) if self.savable is None else np.asarray(self.savable, bool)


@dataclass(frozen=True)
class SaveOrRecomputeAnswer:
    """A save-or-recompute choice and how it was found."""

    save: np.ndarray        # bool [n]
    recompute: np.ndarray   # bool [n]
    keep: np.ndarray        # bool [m]: graph inputs saved for the backward
    runtime: float          # recompute work: the recomputed nodes' ``recompute_work``
    saved_bytes: float = 0.0       # bytes of saved nodes and kept inputs
    source: str = "milp"           # "milp" or "reference" (the answer handed in won)
    status: str = ""               # HiGHS's message, e.g. "Optimization terminated successfully"
    mip_gap: float | None = None   # relative optimality gap HiGHS proved (0 when optimal)
    time_limited: bool = False     # the time limit stopped HiGHS before it proved optimality
    solve_s: float = 0.0           # seconds spent in milp


def _closure(problem: SaveOrRecompute, save: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(recompute, needed inputs): the least recomputation that makes every forward node the
    backward reads available when ``save`` is saved."""
    n = problem.num_forward
    recompute = np.zeros(n, dtype=bool)
    needed_inputs = np.asarray(problem.read_by_backward[n:], dtype=bool).copy()
    stack = [v for v in range(n) if problem.read_by_backward[v] and not save[v]]
    while stack:
        v = stack.pop()
        if recompute[v]:
            continue
        recompute[v] = True
        for u in problem.reads[v]:
            if u >= n:
                needed_inputs[u - n] = True
            elif not save[u] and not recompute[u]:
                stack.append(u)
    return recompute, needed_inputs


def evaluate(problem: SaveOrRecompute, save: np.ndarray, keep: np.ndarray | None = None
             ) -> SaveOrRecomputeAnswer | None:
    """The answer that saves ``save`` (forward nodes) and ``keep`` (graph inputs; default: the
    inputs it needs), recomputing only what the backward then needs; None when that needs a
    node recomputed that may not be, an input that is not kept, or saves an unsavable node.
    Its ``saved_bytes`` may exceed the capacity (``fits`` says)."""
    n = problem.num_forward
    save = np.asarray(save, dtype=bool)
    sizes = np.asarray(problem.sizes, dtype=np.float64)
    recompute, needed_inputs = _closure(problem, save)
    keep = needed_inputs if keep is None else np.asarray(keep, dtype=bool)
    if (recompute & ~np.asarray(problem.recomputable, dtype=bool)).any():
        return None
    if (needed_inputs & ~keep).any() or (save & ~problem.savable_mask()).any():
        return None
    work = recompute_work(problem.runtimes, problem.estimator)
    saved_bytes = float(sizes[:n][save].sum() + sizes[n:][keep].sum())
    return SaveOrRecomputeAnswer(save=save, recompute=recompute, keep=keep,
                                 runtime=float(work[recompute].sum()),
                                 saved_bytes=saved_bytes, source="reference")


def fits(problem: SaveOrRecompute, answer: SaveOrRecomputeAnswer) -> bool:
    """``answer`` saves no more than the capacity (up to float rounding of the byte sums)."""
    return answer.saved_bytes <= problem.capacity * (1 + 1e-9) + 1e-6


def _better(a: SaveOrRecomputeAnswer, b: SaveOrRecomputeAnswer) -> bool:
    # Less recompute runtime first, then fewer saved bytes; the reference keeps a tie.
    scale = max(abs(a.runtime), abs(b.runtime), 1e-300)
    if abs(a.runtime - b.runtime) > 1e-9 * scale:
        return a.runtime < b.runtime
    return a.saved_bytes < b.saved_bytes


def solve_save_or_recompute(problem: SaveOrRecompute, *, time_limit_s: float | None = None,
                            reference: SaveOrRecomputeAnswer | None = None,
                            deterministic: bool = False) -> SaveOrRecomputeAnswer | None:
    """The cheapest save-or-recompute choice (see module doc): the MILP's answer, or
    ``reference`` when that is within the capacity and no worse. None when neither exists
    (HiGHS found no feasible answer in time and there is no fitting reference) or there is no
    forward node. ``time_limit_s`` defaults to ``ILP_GRAPH_TIME_LIMIT_S``; ``deterministic``
    turns it into a node limit (see milp_limits.py)."""
    limit = ILP_GRAPH_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
    if not limit > 0 or math.isnan(limit):
        raise ValueError(f"ilp_graph time limit must be a positive number of seconds, "
                         f"got {time_limit_s!r}")
    if problem.num_forward == 0:
        return None
    found = _solve_milp(problem, limit, deterministic)
    if reference is not None and not fits(problem, reference):
        log.debug("ilp_graph: the reference saves %.0f bytes, over the capacity %.0f",
                  reference.saved_bytes, problem.capacity)
        reference = None
    if reference is not None and (found is None or not _better(found, reference)):
        log.info("ilp_graph: the reference answer (runtime %.4g, %.0f bytes) is kept over the "
                 "MILP's (%s)", reference.runtime, reference.saved_bytes,
                 "none" if found is None else f"runtime {found.runtime:.4g}")
        if found is None:
            return replace(reference, source="reference")
        # keep the MILP's solve report: how hard it tried, and how far from proven optimal
        return replace(reference, source="reference", status=found.status,
                       mip_gap=found.mip_gap, time_limited=found.time_limited,
                       solve_s=found.solve_s)
    return found


def _solve_milp(problem: SaveOrRecompute, time_limit_s: float,
                deterministic: bool) -> SaveOrRecomputeAnswer | None:
    """HiGHS's answer, re-evaluated (the least recomputation its saved set needs); None when it
    found no feasible one."""
    # scipy.optimize takes seconds to import: only when the solver runs.
    from scipy.optimize import milp

    n = problem.num_forward
    sizes = np.asarray(problem.sizes, dtype=np.float64)
    runtimes = np.asarray(problem.runtimes, dtype=np.float64)
    constraints, bounds = _constraints(problem)
    save_cost, recompute_cost = _lexicographic_costs(runtimes, sizes, problem.estimator)
    cost = np.concatenate([save_cost[:n], recompute_cost, save_cost[n:]])
    start = time.perf_counter()
    result = milp(c=cost, constraints=constraints, integrality=np.ones(cost.shape[0]),
                  bounds=bounds, options={**milp_limits(time_limit_s, deterministic=deterministic), "mip_rel_gap": 1e-6})
    elapsed = time.perf_counter() - start
    gap = getattr(result, "mip_gap", None)
    gap = None if gap is None else float(gap)
    time_limited = stopped_by_limit(result.status, str(result.message))
    if result.x is None:  # proven infeasible (the capacity is too small) is not a warning
        log.log(logging.WARNING if time_limited else logging.INFO,
                "ilp_graph: no feasible answer in %.2f s (%s)", elapsed, result.message)
        return None
    level = logging.WARNING if time_limited else logging.INFO
    log.log(level, "ilp_graph: %d forward nodes, %.2f s, %s, optimality gap %s", n, elapsed,
            "stopped by the time limit" if time_limited else "optimal", _percent(gap))
    answer = evaluate(problem, result.x[:n] > 0.5, result.x[2 * n:] > 0.5)
    if answer is None:  # HiGHS's tolerance let an integer variable drift: should not happen
        log.warning("ilp_graph: HiGHS's answer does not check out; ignoring it")
        return None
    return replace(answer, source="milp", status=str(result.message), mip_gap=gap,
                   time_limited=time_limited, solve_s=elapsed)


def _percent(gap: float | None) -> str:
    return "unknown" if gap is None else f"{100 * gap:.3g}%"


def _constraints(problem: SaveOrRecompute) -> tuple[list[Any], Any]:
    """The dependency and memory constraints, and the variable bounds (see module doc)."""
    from scipy.optimize import Bounds, LinearConstraint

    n = problem.num_forward
    sizes = np.asarray(problem.sizes, dtype=np.float64)
    num_inputs = int(sizes.shape[0]) - n
    num_vars = 2 * n + num_inputs
    dependency = LowerBoundRows()
    add = dependency.add
    # Columns: save[v] = v, recompute[v] = n + v, keep[input k] = 2n + k.
    for v in range(n):
        if problem.read_by_backward[v]:
            add([(v, 1.0), (n + v, 1.0)], 1.0)
        for u in problem.reads[v]:
            if u < n:
                add([(u, 1.0), (n + u, 1.0), (n + v, -1.0)], 0.0)
            else:
                add([(n + u, 1.0), (n + v, -1.0)], 0.0)
    memory_row = np.concatenate([sizes[:n], np.zeros(n), sizes[n:]])
    constraints = [
        dependency.constraint(num_vars),
        LinearConstraint(memory_row.reshape(1, -1), ub=problem.capacity),
    ]
    input_lower = np.asarray(problem.read_by_backward[n:], dtype=np.float64)
    lower_bounds = np.concatenate([np.zeros(2 * n), input_lower])
    upper = np.concatenate([problem.savable_mask().astype(np.float64),
                            np.asarray(problem.recomputable, dtype=np.float64),
                            np.ones(num_inputs)])
    return constraints, Bounds(lower_bounds, upper)
