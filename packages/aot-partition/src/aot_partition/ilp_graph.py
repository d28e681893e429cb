"""The "ilp_graph" budget solver: save-or-recompute for the whole forward as one MILP (HiGHS).

It works on arrays (``SaveOrRecompute``), not on fx nodes: ``budget.py`` describes the forward
graph with them and reads the answer back. Variables, per forward node v (not an input):
``save[v]`` and ``recompute[v]`` in {0, 1}; per graph input u: ``keep[u]`` (saved for the
backward, needed when the backward or a recomputed node reads it).

- every forward node that a backward node reads is available: save + recompute >= 1;
- recomputing v needs each forward input u available: save[u] + recompute[u] >= recompute[v]
  (a graph input read by a recomputed node must be kept);
- nodes the aggressive policy still bans, other than the knapsack candidates, are never
  recomputed;
- saved bytes fit the budget: sum(bytes * save) + sum(bytes * keep) <= min_bytes + budget *
  (max_bytes - min_bytes), the memory ratio of the other solvers, and no more than the "dp"
  solver's answer saves (so the result is never worse than it on memory);
- minimize the estimated runtime of what is recomputed; ties go to fewer saved bytes, then to
  fewer recomputed nodes (see ``_lexicographic_costs``).

Unlike the knapsack solvers, it accounts for what recomputing a node needs, and it returns the
saved values directly (no final min cut). ``ILP_GRAPH_TIME_LIMIT_S`` bounds the solve; on time-out
the best feasible answer found is used, and without one the "dp" answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["ILP_GRAPH_TIME_LIMIT_S", "SaveOrRecompute", "SaveOrRecomputeAnswer",
           "solve_save_or_recompute"]

ILP_GRAPH_TIME_LIMIT_S = 10.0


def _lexicographic_costs(runtimes: np.ndarray, sizes: np.ndarray, estimator: str
                         ) -> tuple[np.ndarray, np.ndarray]:
    # runtimes: one per forward node; sizes: forward nodes, then graph inputs.
    """Objective weights: recompute work first, then saved bytes, then recomputed node count.

    With the "flops" estimator, ops without a FLOP formula (estimate 1) count as no work, so
    among answers with the least FLOPs the one saving the fewest bytes wins.
    """
    work = np.where(runtimes > 1, runtimes, 0.0) if estimator == "flops" else runtimes.copy()
    positive = work[work > 0]
    unit = float(positive.min()) if positive.size else 1.0
    # All bytes together weigh less than the smallest unit of work ...
    save_cost = 0.5 * unit * sizes / max(float(sizes.sum()), 1.0)
    positive_bytes = save_cost[save_cost > 0]
    # ... and all recomputed nodes together less than the smallest saved tensor.
    per_node = 0.5 * (float(positive_bytes.min()) if positive_bytes.size else unit) / len(sizes)
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

    @property
    def num_forward(self) -> int:
        return int(self.runtimes.shape[0])


@dataclass(frozen=True)
class SaveOrRecomputeAnswer:
    save: np.ndarray        # bool [n]
    recompute: np.ndarray   # bool [n]
    keep: np.ndarray        # bool [m]: graph inputs saved for the backward
    runtime: float          # estimated runtime of the recomputed nodes


def solve_save_or_recompute(problem: SaveOrRecompute, *,
                            time_limit_s: float = ILP_GRAPH_TIME_LIMIT_S
                            ) -> SaveOrRecomputeAnswer | None:
    """The cheapest save-or-recompute choice (see module doc); None when HiGHS finds no
    feasible answer in time or there is no forward node."""
    # scipy.optimize takes seconds to import: only when the solver runs.
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n = problem.num_forward
    if n == 0:
        return None
    sizes = np.asarray(problem.sizes, dtype=np.float64)
    num_inputs = int(sizes.shape[0]) - n
    num_vars = 2 * n + num_inputs
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []

    def add(entries: list[tuple[int, float]], lb: float) -> None:
        for col, val in entries:
            rows.append(len(lower))
            cols.append(col)
            vals.append(val)
        lower.append(lb)

    # Columns: save[v] = v, recompute[v] = n + v, keep[input k] = 2n + k.
    for v in range(n):
        if problem.read_by_backward[v]:
            add([(v, 1.0), (n + v, 1.0)], 1.0)
        for u in problem.reads[v]:
            if u < n:
                add([(u, 1.0), (n + u, 1.0), (n + v, -1.0)], 0.0)
            else:
                add([(n + u, 1.0), (n + v, -1.0)], 0.0)
    input_lower = np.asarray(problem.read_by_backward[n:], dtype=np.float64)
    runtimes = np.asarray(problem.runtimes, dtype=np.float64)
    dependency = coo_matrix((vals, (rows, cols)), shape=(len(lower), num_vars)).tocsr()
    memory_row = np.concatenate([sizes[:n], np.zeros(n), sizes[n:]])
    constraints = [
        LinearConstraint(dependency, lb=np.asarray(lower), ub=np.inf),
        LinearConstraint(memory_row.reshape(1, -1), ub=problem.capacity),
    ]
    lower_bounds = np.concatenate([np.zeros(2 * n), input_lower])
    upper = np.concatenate([np.ones(n), np.asarray(problem.recomputable, dtype=np.float64),
                            np.ones(num_inputs)])
    save_cost, recompute_cost = _lexicographic_costs(runtimes, sizes, problem.estimator)
    cost = np.concatenate([save_cost[:n], recompute_cost, save_cost[n:]])
    result = milp(c=cost, constraints=constraints, integrality=np.ones(num_vars),
                  bounds=Bounds(lower_bounds, upper),
                  options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6})
    if result.x is None:
        log.warning("ilp_graph: no feasible answer (%s)", result.message)
        return None
    if not result.success:
        log.warning("ilp_graph: stopped early (%s); using the best answer found", result.message)
    recompute = result.x[n:2 * n] > 0.5
    return SaveOrRecomputeAnswer(save=result.x[:n] > 0.5, recompute=recompute,
                                 keep=result.x[2 * n:] > 0.5,
                                 runtime=float(runtimes[recompute].sum()))
