"""The graph-agnostic core: numpy and scipy only, no torch.

A front end (``aot_partition.fx`` for torch.fx joints, or any other compiler) describes its joint
forward/backward graph as plain ``CoreNode`` data; the core builds the min-cut network, solves
it (``mincut``), and answers budget questions with the knapsack solvers (``knapsack``) and the
whole-graph MILP (``ilp_graph``). Importing this package never imports torch.
"""

from __future__ import annotations

from . import knapsack
from .graph import (
    CATEGORIES,
    CoreDecision,
    CoreGraph,
    CoreGraphError,
    CoreNode,
    CorePartition,
    default_save_costs,
    distances_from_backward,
    partition,
)

__all__ = [
    "CATEGORIES",
    "CoreDecision",
    "CoreGraph",
    "CoreGraphError",
    "CoreNode",
    "CorePartition",
    "default_save_costs",
    "distances_from_backward",
    "knapsack",
    "partition",
]
