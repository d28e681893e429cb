"""The "ilp_graph" budget solver: save-or-recompute for the whole forward as one MILP (HiGHS).

Variables, per forward node v (not an input): ``save[v]`` and ``recompute[v]`` in {0, 1}; per
graph input u: ``keep[u]`` (saved for the backward, needed when the backward or a recomputed node
reads it).

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
from typing import TYPE_CHECKING

import numpy as np
import torch.fx as fx
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .estimators import estimate_runtime
from .sizes import node_nbytes

if TYPE_CHECKING:
    from .budget import BudgetSearch

log = logging.getLogger(__name__)

__all__ = ["ILP_GRAPH_TIME_LIMIT_S", "ilp_graph_saved_values"]

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


def ilp_graph_saved_values(search: BudgetSearch, memory_budget: float, *,
                           max_bytes: float | None = None,
                           time_limit_s: float = ILP_GRAPH_TIME_LIMIT_S
                           ) -> tuple[list[fx.Node], float] | None:
    """(saved values in graph order, estimated recompute runtime) at ``memory_budget``.

    ``max_bytes`` caps the saved bytes further (BudgetSearch passes the "dp" answer's). None
    when HiGHS finds no feasible answer in time.
    """
    info = search.node_info
    inputs = set(info.inputs)
    forward = [n for n in info.required_fw_nodes if n not in inputs and n.op != "placeholder"]
    index = {n: i for i, n in enumerate(forward)}
    n = len(forward)
    if n == 0:
        return None
    recomputable = np.ones(n, dtype=bool)
    banned = set(search.aggressive_banned) - set(search.candidates)
    for node in banned:
        if node in index:
            recomputable[index[node]] = False

    graph_inputs = list(info.inputs)
    input_index = {node: 2 * n + k for k, node in enumerate(graph_inputs)}
    num_vars = 2 * n + len(graph_inputs)
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

    def read_by_backward(node: fx.Node) -> bool:
        return any(user not in info.required_fw and user.op != "output" for user in node.users)

    # Columns: save[v] = v, recompute[v] = n + v, keep[input k] = 2n + k.
    for v, node in enumerate(forward):
        if read_by_backward(node):
            add([(v, 1.0), (n + v, 1.0)], 1.0)
        for arg in node.all_input_nodes:
            if arg in index:
                u = index[arg]
                add([(u, 1.0), (n + u, 1.0), (n + v, -1.0)], 0.0)
            elif arg in input_index:
                add([(input_index[arg], 1.0), (n + v, -1.0)], 0.0)
    input_lower = np.array([1.0 if read_by_backward(node) else 0.0 for node in graph_inputs])
    sizes = np.array([node_nbytes(node) for node in forward + graph_inputs], dtype=np.float64)
    runtimes = np.array([estimate_runtime(node, search.estimator) for node in forward])
    dependency = coo_matrix((vals, (rows, cols)), shape=(len(lower), num_vars)).tocsr()
    # The memory ratio counts all inputs as its zero point; kept inputs are charged here.
    capacity = search.min_bytes + max(memory_budget, 0.0) * (search.max_bytes - search.min_bytes)
    if max_bytes is not None:
        capacity = min(capacity, max_bytes)
    memory_row = np.concatenate([sizes[:n], np.zeros(n), sizes[n:]])
    constraints = [
        LinearConstraint(dependency, lb=np.asarray(lower), ub=np.inf),
        LinearConstraint(memory_row.reshape(1, -1), ub=capacity),
    ]
    lower_bounds = np.concatenate([np.zeros(2 * n), input_lower])
    upper = np.concatenate([np.ones(n), recomputable.astype(np.float64),
                            np.ones(len(graph_inputs))])
    save_cost, recompute_cost = _lexicographic_costs(runtimes, sizes, search.estimator)
    cost = np.concatenate([save_cost[:n], recompute_cost, save_cost[n:]])
    result = milp(c=cost, constraints=constraints, integrality=np.ones(num_vars),
                  bounds=Bounds(lower_bounds, upper),
                  options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6})
    if result.x is None:
        log.warning("ilp_graph: no feasible answer at budget %.3f (%s)", memory_budget,
                    result.message)
        return None
    if not result.success:
        log.warning("ilp_graph: stopped early (%s); using the best answer found", result.message)
    save = result.x[:n] > 0.5
    recompute = result.x[n:2 * n] > 0.5
    chosen = {forward[v] for v in np.flatnonzero(save).tolist()}
    chosen |= {graph_inputs[k] for k in np.flatnonzero(result.x[2 * n:] > 0.5).tolist()}
    order = {node: i for i, node in enumerate(search.joint_graph.nodes)}
    saved = sorted(chosen, key=order.__getitem__)
    return saved, float(runtimes[recompute].sum())
