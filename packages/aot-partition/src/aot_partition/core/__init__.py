"""The graph-agnostic core: numpy and scipy only, no torch.

A front end (``aot_partition.fx`` for torch.fx joints, or any other compiler) describes its joint
forward/backward graph as plain ``CoreNode`` data; the core builds the min-cut network, solves
it (``mincut``), and answers budget questions with the knapsack solvers (``knapsack``) and the
whole-graph MILP (``ilp_graph``). ``partition_under_budget`` (``budget``) chooses a cut under a
fraction, a byte cap or a peak cap (``timeline``: the plain-data memory timeline) and reports it
in core terms (``report``); ``load_core_graph`` (``load``) reads a graph from JSON. Importing
this package never imports torch.
"""

from __future__ import annotations

from ..errors import InfeasibleMinCutError, UnreachableMemoryBudgetError
from . import knapsack
from .budget import BudgetedPartition, CoreBudget, partition_under_budget
from .graph import (
    CATEGORIES,
    CoreDecision,
    CoreGraph,
    CoreGraphError,
    CoreNode,
    CorePartition,
    ban_reasons,
    default_save_costs,
    distances_from_backward,
    partition,
)
from .load import dump_core_graph, load_core_graph
from .report import CoreReport
from .timeline import CoreMemoryTimeline, simulate_memory

__all__ = [
    "BudgetedPartition",
    "CATEGORIES",
    "CoreBudget",
    "CoreDecision",
    "CoreGraph",
    "CoreGraphError",
    "CoreMemoryTimeline",
    "CoreNode",
    "CorePartition",
    "CoreReport",
    "InfeasibleMinCutError",
    "UnreachableMemoryBudgetError",
    "ban_reasons",
    "default_save_costs",
    "distances_from_backward",
    "dump_core_graph",
    "knapsack",
    "load_core_graph",
    "partition",
    "partition_under_budget",
    "simulate_memory",
]
