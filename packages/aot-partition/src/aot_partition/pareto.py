"""The memory-budget Pareto sweep: (budget, recompute runtime, memory ratio) for many budgets.

One ``BudgetSearch`` is prepared per joint graph (the runtime-optimal and aggressive cuts, the
knapsack items and their runtime estimates), then every budget costs one knapsack and one cut.
The partitioner calls ``sweep`` and ``write_pareto_png`` when the flag
``visualize_memory_budget_pareto`` is on; ``memory_budget_pareto`` is the standalone sweep.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from .budget import BudgetSearch, needed_by_backward
from .classify import classify
from .config import PartitionConfig
from .draw import plot_pareto
from .prepare import prepared_joint
from .sizes import node_nbytes

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BUDGETS", "ParetoPoint", "memory_budget_pareto", "sweep", "plot_pareto"]

DEFAULT_BUDGETS = tuple(b / 100 for b in range(100, -1, -5))
_figure_ids = itertools.count()


@dataclass(frozen=True)
class ParetoPoint:
    budget: float              # the requested activation memory budget
    recompute_runtime: float   # estimated runtime of the released (recomputed) banned nodes
    memory_ratio: float        # saved bytes: 0 = the budget-0 cut, 1 = runtime-optimal cut
    saved_bytes: int           # bytes the backward reads (inputs included)
    num_saved: int


def sweep(search: BudgetSearch, budgets: Sequence[float] = DEFAULT_BUDGETS) -> list[ParetoPoint]:
    """A ParetoPoint for each budget, using an already prepared search.

    Bytes and the memory ratio count what the partition would save (``needed_by_backward``);
    the ratio runs from the budget-0 answer (0.0) to the runtime-optimal cut (1.0).
    """
    chosen = [(float(budget), *search.saved_values(budget)) for budget in budgets]
    saved_bytes = [_bytes(needed_by_backward(search, saved)) for _, saved, _ in chosen]
    low = _bytes(needed_by_backward(search, search.saved_values(0.0)[0]))
    high = _bytes(needed_by_backward(search, search.runtime_optimal))
    span = high - low
    return [ParetoPoint(budget, runtime, (nbytes - low) / span if span > 0 else 0.0, nbytes,
                        len(needed_by_backward(search, saved)))
            for (budget, saved, runtime), nbytes in zip(chosen, saved_bytes)]


def _bytes(nodes: Sequence[fx.Node]) -> int:
    return sum(node_nbytes(n) for n in nodes)


def memory_budget_pareto(joint_module: fx.GraphModule, joint_inputs: Any = None, *,
                         num_fwd_outputs: int, budgets: Sequence[float] | None = None,
                         solver: str | None = None, config: PartitionConfig | None = None
                         ) -> list[ParetoPoint]:
    """Sweep ``budgets`` (default 1.0 down to 0.0 by 0.05) on a copy of ``joint_module``.

    The joint graph is cleaned like the partitioner does (DCE, CSE, recompute tags) first. With
    ``config.visualize_pareto`` (the flag ``visualize_memory_budget_pareto``) on, the front is
    also written as a PNG. ``config``: the settings of the sweep (default: the flags now).
    """
    del joint_inputs  # accepted for the partition_fn-like signature; shapes come from meta
    config = config if config is not None else PartitionConfig.from_flags()
    # A copy: the recompute-tag cleanup rewrites node annotations.
    with prepared_joint(copy.deepcopy(joint_module), num_fwd_outputs, config=config) as module:
        info = classify(module, num_fwd_outputs)
        search = BudgetSearch.prepare(module.graph, info, solver=solver, config=config)
        points = sweep(search, DEFAULT_BUDGETS if budgets is None else budgets)
    if config.visualize_pareto:
        write_pareto_png(points, search.solver)
    return points


def write_pareto_png(points: list[ParetoPoint], label: str) -> str:
    path = f"memory_budget_pareto_{next(_figure_ids)}.png"
    plot_pareto({label: points}, path)
    log.warning("Generated Pareto frontier curve at %s", path)
    return path
