"""Keep, recompute or offload every forward value: ``ilp_graph``'s MILP with a third fate.

The problem is ``ilp_graph.SaveOrRecompute`` plus, per forward node v, the time an offload of v
would cost (``exposed_s[v]``: its copy to host and back, less what the compute between its last
forward use and its first backward use hides; ``inf`` where v may not be offloaded) and the
one-way copy time (``transfer_s[v]``). Variables: save, recompute and offload per forward node,
keep per graph input.

- every forward node the backward reads is available: save + recompute + offload >= 1;
- recomputing v needs each input u available: save[u] + recompute[u] + offload[u] >=
  recompute[v] (an offloaded value is back on the device before the backward reads it);
- saved bytes on the device fit: sum(bytes * save) + sum(bytes * keep) <= capacity (an offloaded
  value is on the host over its window; the peak budget measures what that really frees);
- the copies fit the link: sum(transfer_s * offload) <= link_s (one copy stream each way);
- minimize recompute runtime + exposed copy time (in the estimator's seconds); ties go to
  fewer saved bytes, then fewer recomputed or offloaded nodes (keeping beats a free offload).

Fast and proven (issue 29): the LP relaxation is solved first; its value is a lower bound and
its solution is nearly integral on transformer joints, so fixing its integral variables leaves
a small MILP whose answer, with the ``reference`` (the "dp" answer), is the incumbent. Only
when that incumbent is not within ``gap`` of the bound does HiGHS run on the whole MILP, under
a node limit (no wall-clock in the decision: every rank gets the same answer). The answer
reports the gap it proved against the best lower bound found.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .ilp_graph import SaveOrRecompute, _lexicographic_costs, evaluate
from .milp_limits import stopped_by_limit
from .sparse_rows import LowerBoundRows

log = logging.getLogger(__name__)

__all__ = ["OFFLOAD_MILP_GAP", "OFFLOAD_MILP_NODE_LIMIT", "KeepRecomputeOffload",
           "KeepRecomputeOffloadAnswer", "evaluate_plan", "least_saved_bytes",
           "solve_keep_recompute_offload"]

# The relative optimality gap a plan must be proven within (issue 29: 1%).
OFFLOAD_MILP_GAP = 0.01
# Branch-and-bound nodes HiGHS may spend on the whole MILP when the LP rounding is not within
# the gap (a node limit, not seconds: the same answer on every rank).
OFFLOAD_MILP_NODE_LIMIT = 300
_INTEGRAL = 1e-6
# Restricted MILPs tried around the LP's fractional variables, each over a wider neighbourhood
# (two graph hops more each time), before the whole MILP.
NEIGHBOURHOOD_ROUNDS = 6


@dataclass(frozen=True)
class KeepRecomputeOffload:
    """The problem: ``base``'s save-or-recompute problem and each node's offload costs."""

    base: SaveOrRecompute
    exposed_s: np.ndarray    # float64 [n]: copy time not hidden (inf: may not be offloaded)
    transfer_s: np.ndarray   # float64 [n]: one-way copy time
    link_s: float = math.inf  # copy time the link carries in one step, each way

    def __post_init__(self) -> None:
        n = self.base.num_forward
        for name in ("exposed_s", "transfer_s"):
            value = np.asarray(getattr(self, name), dtype=np.float64)
            if value.shape != (n,):
                raise ValueError(f"KeepRecomputeOffload.{name} must have one entry per forward "
                                 f"node ({n}), got shape {value.shape}")
            if np.isnan(value).any() or (value < 0).any():
                raise ValueError(f"KeepRecomputeOffload.{name} must be >= 0 (inf for "
                                 f"exposed_s: not offloadable), got {value!r}")
        if not self.link_s >= 0:
            raise ValueError(f"KeepRecomputeOffload.link_s must be >= 0, got {self.link_s!r}")

    @property
    def offloadable(self) -> np.ndarray:
        return (np.isfinite(self.exposed_s) & self.base.savable_mask()
                & np.asarray(self.base.read_by_backward[: self.base.num_forward], dtype=bool))


@dataclass(frozen=True)
class KeepRecomputeOffloadAnswer:
    """A keep / recompute / offload plan and how it was found."""

    save: np.ndarray        # bool [n]: kept on the device
    recompute: np.ndarray   # bool [n]
    offload: np.ndarray     # bool [n]: copied to host in the forward, back for the backward
    keep: np.ndarray        # bool [m]: graph inputs saved for the backward
    recompute_s: float      # recompute work (``ilp_graph.recompute_work``)
    exposed_s: float        # offload copy time not hidden behind compute
    saved_bytes: float      # device bytes of kept nodes and kept inputs
    offloaded_bytes: float
    objective: float = 0.0  # in the MILP's lexicographic units
    source: str = "milp"    # "lp rounding", "milp" or "reference"
    lower_bound: float = 0.0   # the best proven lower bound on the objective
    gap: float = 0.0           # (objective - lower_bound) / objective, proven
    solve_s: float = 0.0       # seconds spent (reported, never used to decide)

    @property
    def runtime(self) -> float:
        """What the plan adds to a step: recompute plus exposed copies."""
        return self.recompute_s + self.exposed_s


def _costs(problem: KeepRecomputeOffload) -> np.ndarray:
    """Objective per column: save, recompute, offload (n each), then keep (m)."""
    base = problem.base
    n = base.num_forward
    sizes = np.asarray(base.sizes, dtype=np.float64)
    save_cost, recompute_cost = _lexicographic_costs(base.runtimes, sizes, base.estimator)
    work_unit = _work_unit(base)
    per_node = recompute_cost - _work(base) / work_unit  # the tie-breaking share
    exposed = np.where(problem.offloadable, problem.exposed_s, 0.0) / work_unit
    # Offloading weighs a saved tensor's bytes too: among free choices, keeping wins.
    offload_cost = exposed + save_cost[:n] + per_node
    return np.concatenate([save_cost[:n], recompute_cost, offload_cost, save_cost[n:]])


def _work(base: SaveOrRecompute) -> np.ndarray:
    from .ilp_graph import recompute_work

    return recompute_work(base.runtimes, base.estimator)


def _work_unit(base: SaveOrRecompute) -> float:
    work = _work(base)
    positive = work[work > 0]
    return float(positive.min()) if positive.size else 1.0


def evaluate_plan(problem: KeepRecomputeOffload, save: np.ndarray, offload: np.ndarray,
                  keep: np.ndarray | None = None) -> KeepRecomputeOffloadAnswer | None:
    """The plan that keeps ``save``, offloads ``offload`` and recomputes the least the backward
    then needs; None when that recomputes a banned node, needs an input not kept, saves an
    unsavable node or offloads one that may not be. Its bytes may exceed the capacity."""
    base = problem.base
    n = base.num_forward
    save = np.asarray(save, dtype=bool)
    offload = np.asarray(offload, dtype=bool) & ~save
    if (offload & ~problem.offloadable).any():
        return None
    available = evaluate(base, save | offload, keep)
    if available is None:
        return None
    sizes = np.asarray(base.sizes, dtype=np.float64)
    offloaded_bytes = float(sizes[:n][offload].sum())
    exposed = float(problem.exposed_s[offload].sum())
    x = np.concatenate([save, available.recompute, offload, available.keep]).astype(np.float64)
    return KeepRecomputeOffloadAnswer(
        save=save, recompute=available.recompute, offload=offload, keep=available.keep,
        recompute_s=available.runtime, exposed_s=exposed,
        saved_bytes=available.saved_bytes - offloaded_bytes, offloaded_bytes=offloaded_bytes,
        objective=float(_costs(problem) @ x), source="reference")


def _fits(problem: KeepRecomputeOffload, answer: KeepRecomputeOffloadAnswer) -> bool:
    capacity = problem.base.capacity
    link = float(problem.transfer_s[answer.offload].sum())
    return (answer.saved_bytes <= capacity * (1 + 1e-9) + 1e-6
            and link <= problem.link_s * (1 + 1e-9) + 1e-12)


def _model(problem: KeepRecomputeOffload) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """(constraints, lower bounds, upper bounds) of the MILP (see module doc)."""
    from scipy.optimize import LinearConstraint

    base = problem.base
    n = base.num_forward
    sizes = np.asarray(base.sizes, dtype=np.float64)
    num_inputs = int(sizes.shape[0]) - n
    dependency = LowerBoundRows()
    add = dependency.add
    # Columns: save[v] = v, recompute[v] = n + v, offload[v] = 2n + v, keep[k] = 3n + k.
    for v in range(n):
        if base.read_by_backward[v]:
            add([(v, 1.0), (n + v, 1.0), (2 * n + v, 1.0)], 1.0)
        for u in base.reads[v]:
            if u < n:
                add([(u, 1.0), (n + u, 1.0), (2 * n + u, 1.0), (n + v, -1.0)], 0.0)
            else:
                add([(2 * n + u, 1.0), (n + v, -1.0)], 0.0)  # keep[k] is column 3n + k
    num_vars = 3 * n + num_inputs
    memory_row = np.concatenate([sizes[:n], np.zeros(2 * n), sizes[n:]])
    link_row = np.concatenate([np.zeros(2 * n), np.asarray(problem.transfer_s, np.float64),
                               np.zeros(num_inputs)])
    constraints = [dependency.constraint(num_vars),
                   LinearConstraint(memory_row.reshape(1, -1), ub=base.capacity)]
    if math.isfinite(problem.link_s):
        constraints.append(LinearConstraint(link_row.reshape(1, -1), ub=problem.link_s))
    lower_bounds = np.concatenate([np.zeros(3 * n),
                                   np.asarray(base.read_by_backward[n:], dtype=np.float64)])
    upper = np.concatenate([base.savable_mask().astype(np.float64),
                            np.asarray(base.recomputable, dtype=np.float64),
                            problem.offloadable.astype(np.float64), np.ones(num_inputs)])
    return constraints, lower_bounds, upper


def _read(problem: KeepRecomputeOffload, x: np.ndarray | None, source: str
          ) -> KeepRecomputeOffloadAnswer | None:
    """A MILP/LP point, re-evaluated (the least recomputation its kept and offloaded sets
    need); None unless it checks out and fits."""
    if x is None:
        return None
    n = problem.base.num_forward
    answer = evaluate_plan(problem, x[:n] > 0.5, x[2 * n:3 * n] > 0.5, x[3 * n:] > 0.5)
    if answer is None or not _fits(problem, answer):
        return None
    return replace(answer, source=source)


def solve_keep_recompute_offload(problem: KeepRecomputeOffload, *,
                                 reference: KeepRecomputeOffloadAnswer | None = None,
                                 gap: float = OFFLOAD_MILP_GAP,
                                 node_limit: int = OFFLOAD_MILP_NODE_LIMIT
                                 ) -> KeepRecomputeOffloadAnswer | None:
    """The cheapest plan found, proven within ``gap`` of optimal when its ``gap`` says so
    (see module doc); ``reference`` competes and wins ties. None when the problem is
    infeasible and no fitting reference is given."""
    from scipy.optimize import Bounds, milp

    if not 0 <= gap < 1:
        raise ValueError(f"offload MILP gap must be in [0, 1), got {gap!r}")
    if isinstance(node_limit, bool) or not isinstance(node_limit, int) or node_limit < 1:
        raise ValueError(f"offload MILP node limit must be an int >= 1, got {node_limit!r}")
    start = time.perf_counter()
    cost = _costs(problem)
    constraints, lower, upper = _model(problem)
    integrality = np.ones(cost.shape[0])
    lp = milp(c=cost, constraints=constraints, integrality=np.zeros_like(integrality),
              bounds=Bounds(lower, upper))
    if reference is not None and not _fits(problem, reference):
        reference = None
    if lp.x is None:  # the LP is infeasible, so is the MILP
        return _finish(reference, -math.inf, start)
    bound = float(lp.fun)
    found = [a for a in (reference, _read(problem, lp.x, "lp rounding")) if a is not None]
    # The LP's integral variables fixed but for the nodes near its fractional ones (a few),
    # which HiGHS decides; the neighbourhood widens while the answer is not within the gap.
    fractional = np.abs(lp.x - np.round(lp.x)) > _INTEGRAL
    free_nodes = _column_nodes(problem, np.flatnonzero(fractional))
    best = _best(found)
    for _ in range(NEIGHBOURHOOD_ROUNDS):
        if best is not None and _gap(best.objective, bound) <= gap:
            break
        free = fractional | _node_columns(problem, free_nodes)
        fixed = np.round(lp.x)
        rounded = milp(c=cost, constraints=constraints, integrality=integrality,
                       bounds=Bounds(np.where(free, lower, fixed), np.where(free, upper, fixed)),
                       options={"node_limit": node_limit, "mip_rel_gap": gap})
        found += [a for a in (_read(problem, rounded.x, "lp rounding"),) if a is not None]
        best = _best(found)
        free_nodes = _widen(problem, free_nodes)
    if best is None or _gap(best.objective, bound) > gap:
        whole = milp(c=cost, constraints=constraints, integrality=integrality,
                     bounds=Bounds(lower, upper),
                     options={"node_limit": node_limit, "mip_rel_gap": gap})
        dual = getattr(whole, "mip_dual_bound", None)
        if dual is not None and math.isfinite(dual) and whole.x is not None:
            bound = max(bound, float(dual))
        if whole.x is None and not stopped_by_limit(whole.status, str(whole.message)):
            log.info("offload MILP: %s", whole.message)
        candidate = _read(problem, whole.x, "milp")
        best = _best([*found, *([candidate] if candidate is not None else [])])
    return _finish(best, bound, start)


def _column_nodes(problem: KeepRecomputeOffload, columns: np.ndarray) -> set[int]:
    """The nodes (forward 0..n-1, inputs n..) whose variables are ``columns``."""
    n = problem.base.num_forward
    return {int(c) - 2 * n if c >= 3 * n else int(c) % n for c in columns}


def _node_columns(problem: KeepRecomputeOffload, nodes: set[int]) -> np.ndarray:
    n = problem.base.num_forward
    num_inputs = int(np.asarray(problem.base.sizes).shape[0]) - n
    mask = np.zeros(3 * n + num_inputs, dtype=bool)
    for v in nodes:
        if v < n:
            mask[[v, n + v, 2 * n + v]] = True
        else:
            mask[2 * n + v] = True
    return mask


def _widen(problem: KeepRecomputeOffload, nodes: set[int]) -> set[int]:
    """``nodes`` and every node two read edges away (either direction)."""
    reads = problem.base.reads
    readers: dict[int, list[int]] = {}
    for v, inputs in enumerate(reads):
        for u in inputs:
            readers.setdefault(u, []).append(v)
    grown = set(nodes)
    for _ in range(2):
        grown |= {u for v in grown if v < len(reads) for u in reads[v]}
        grown |= {w for v in list(grown) for w in readers.get(v, ())}
    return grown


def least_saved_bytes(problem: KeepRecomputeOffload, *,
                      node_limit: int = OFFLOAD_MILP_NODE_LIMIT) -> float | None:
    """The fewest device bytes any plan keeps (capacity ignored; the link still counts), as
    ``evaluate_plan`` measures the plan HiGHS finds (exact unless the node limit stops it);
    None when no plan exists."""
    from scipy.optimize import Bounds, milp

    base = problem.base
    n = base.num_forward
    sizes = np.asarray(base.sizes, dtype=np.float64)
    unbounded = replace(problem, base=replace(base, capacity=math.inf))
    constraints, lower, upper = _model(unbounded)
    cost = np.concatenate([sizes[:n], np.zeros(2 * n), sizes[n:]])
    found = milp(c=cost, constraints=constraints, integrality=np.ones(cost.shape[0]),
                 bounds=Bounds(lower, upper), options={"node_limit": node_limit})
    answer = _read(unbounded, found.x, "milp")
    return None if answer is None else answer.saved_bytes


def _gap(objective: float, bound: float) -> float:
    if not math.isfinite(bound):
        return math.inf
    return max(objective - bound, 0.0) / max(abs(objective), 1e-300)


def _best(found: list[KeepRecomputeOffloadAnswer]) -> KeepRecomputeOffloadAnswer | None:
    """The least objective; the first (the reference) keeps a tie."""
    best: KeepRecomputeOffloadAnswer | None = None
    for answer in found:
        if best is None or answer.objective < best.objective * (1 - 1e-12) - 1e-12:
            best = answer
    return best


def _finish(best: KeepRecomputeOffloadAnswer | None, bound: float, start: float
            ) -> KeepRecomputeOffloadAnswer | None:
    if best is None:
        return None
    bound = min(bound, best.objective)
    answer = replace(best, lower_bound=bound, gap=_gap(best.objective, bound),
                     solve_s=time.perf_counter() - start)
    log.info("offload MILP: %s, %d kept, %d recomputed, %d offloaded, gap %.3g%%",
             answer.source, int(answer.save.sum()), int(answer.recompute.sum()),
             int(answer.offload.sum()), 100 * answer.gap)
    return answer
