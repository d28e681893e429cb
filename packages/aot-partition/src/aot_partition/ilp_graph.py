"""The "ilp_graph" budget solver: save-or-recompute for the whole forward as one MILP (HiGHS).

Variables, per forward node v (not an input): ``save[v]`` and ``recompute[v]`` in {0, 1}.

- every forward node that a backward node reads is available: save + recompute >= 1;
- recomputing v needs each forward input u available: save[u] + recompute[u] >= recompute[v]
  (graph inputs are always available);
- nodes the aggressive policy still bans, other than the knapsack candidates, are never
  recomputed;
- saved bytes fit the budget: sum(bytes * save) <= budget * (max_bytes - min_bytes);
- minimize the estimated runtime of what is recomputed (plus a tiny cost per recomputed node,
  so free ops are not recomputed for nothing).

Unlike the knapsack solvers, it accounts for what recomputing a node needs, and it returns the
saved values directly (no final min cut). ``ILP_GRAPH_TIME_LIMIT_S`` bounds the solve; on time-out
the best feasible answer found is used.
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

ILP_GRAPH_TIME_LIMIT_S = 60.0
_PER_NODE_COST = 1e-3


def ilp_graph_saved_values(search: BudgetSearch, memory_budget: float, *,
                           time_limit_s: float = ILP_GRAPH_TIME_LIMIT_S
                           ) -> tuple[list[fx.Node], float]:
    """(saved values in graph order, estimated recompute runtime) at ``memory_budget``."""
    info = search.node_info
    inputs = set(info.inputs)
    forward = [n for n in info.required_fw_nodes if n not in inputs and n.op != "placeholder"]
    index = {n: i for i, n in enumerate(forward)}
    n = len(forward)
    if n == 0:
        return list(info.inputs), 0.0
    recomputable = np.ones(n, dtype=bool)
    banned = set(search.aggressive_banned) - set(search.candidates)
    for node in banned:
        if node in index:
            recomputable[index[node]] = False

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []
    row = 0

    def add(entries: list[tuple[int, float]], lb: float) -> None:
        nonlocal row
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)
        lower.append(lb)
        row += 1

    # Columns: save[v] = v, recompute[v] = n + v.
    for v, node in enumerate(forward):
        if any(user not in info.required_fw and user.op != "output" for user in node.users):
            add([(v, 1.0), (n + v, 1.0)], 1.0)
        for arg in node.all_input_nodes:
            u = index.get(arg)
            if u is not None:
                add([(u, 1.0), (n + u, 1.0), (n + v, -1.0)], 0.0)
    sizes = np.array([node_nbytes(node) for node in forward], dtype=np.float64)
    runtimes = np.array([estimate_runtime(node, search.estimator) for node in forward])
    dependency = coo_matrix((vals, (rows, cols)), shape=(row, 2 * n)).tocsr()
    capacity = max(memory_budget, 0.0) * (search.max_bytes - search.min_bytes)
    constraints = [
        LinearConstraint(dependency, lb=np.asarray(lower), ub=np.inf),
        LinearConstraint(np.concatenate([sizes, np.zeros(n)]).reshape(1, -1), ub=capacity),
    ]
    upper = np.concatenate([np.ones(n), recomputable.astype(np.float64)])
    # Ties in recompute cost go to the answer that saves fewer bytes (worth < one FLOP in all).
    byte_cost = 0.5 * _PER_NODE_COST * sizes / max(float(sizes.sum()), 1.0)
    cost = np.concatenate([byte_cost, runtimes + _PER_NODE_COST])
    result = milp(c=cost, constraints=constraints, integrality=np.ones(2 * n),
                  bounds=Bounds(np.zeros(2 * n), upper),
                  options={"time_limit": time_limit_s})
    if result.x is None:
        log.warning("ilp_graph: no feasible answer at budget %.3f (%s); keeping the "
                    "fully aggressive cut", memory_budget, result.message)
        return list(search.aggressive), 0.0
    if not result.success:
        log.warning("ilp_graph: stopped early (%s); using the best answer found", result.message)
    save = result.x[:n] > 0.5
    recompute = result.x[n:] > 0.5
    chosen = {forward[v] for v in np.flatnonzero(save).tolist()}
    needed_inputs = set()
    for node in info.inputs:
        if any((user not in info.required_fw and user.op != "output") or (user in index and recompute[index[user]])
               for user in node.users):
            needed_inputs.add(node)
    order = {node: i for i, node in enumerate(search.joint_graph.nodes)}
    saved = sorted(chosen | needed_inputs, key=order.__getitem__)
    return saved, float(runtimes[recompute].sum())
