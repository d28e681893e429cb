"""Choosing a cut under a budget: a fraction of the runtime-optimal activations (``search``),
a cap in bytes or on the simulated peak (``caps``), per-region budgets (``regions``), and the
reference check that compares the answer with independent candidates (``reference``).

``aot_partition.budget`` was a module before 0.2; its names still resolve here (with a
DeprecationWarning) until 0.3: import them from ``aot_partition.budget.search``.
"""

from __future__ import annotations

from .. import _fx_extra  # noqa: F401 - first: without torch, an error naming the extra

# isort: split

import importlib
import warnings
from typing import Any

_OLD_NAMES = frozenset({"BUDGET_SOLVERS", "BudgetSearch", "choose_saved_values_set",
                        "validate_memory_budget", "GRAPH_AWARE_SOLVERS", "DP_GRAPH_MAX_REPAIRS"})


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        warnings.warn(f"aot_partition.budget.{name} moved to aot_partition.budget.search.{name}; "
                      f"the old path goes away in 0.3", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(".search", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
