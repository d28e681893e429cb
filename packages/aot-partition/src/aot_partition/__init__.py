"""aot_partition: forward/backward partitioners for AOTAutograd joint graphs.

``default_partition`` and ``min_cut_rematerialization_partition`` have torch's partition_fn
signature. Flags come from ``aot_config.functorch``, read once per call into a
``PartitionConfig`` (or pass ``config=``). The optional extras (pydot for
``draw_graph``, matplotlib for Pareto plots) are imported only when a picture is drawn.
"""

from __future__ import annotations

from . import knapsack
from .classify import NodeInfo, OpTypes, classify, default_op_types
from .config import PartitionConfig
from .draw import draw_graph
from .errors import (
    FlagConflictError,
    GraphCycleError,
    InfeasibleMinCutError,
    MissingMetadataError,
    PartitionDisagreementError,
    PartitionError,
    UnreachableMemoryBudgetError,
)
from .memory import (
    LiveBuffer,
    MeasuredMemory,
    MemoryStep,
    MemoryTimeline,
    measure_partition,
    simulate_joint,
    simulate_partition,
)
from .memory_plot import write_memory_timeline_png
from .mincut import FlowNetwork, MinCut, get_solver
from .pareto import memory_budget_pareto
from .partitioners import (
    MemoryBudgetBestEffortWarning,
    default_partition,
    explain_partition,
    min_cut_rematerialization_partition,
)
from .policy import MinCutOptions
from .region_budget import RegionOutcome
from .regions import region_memory_budget
from .report import NodeDecision, PartitionReport
from .sizes import node_nbytes, saved_activation_bytes
from .solve import solve_min_cut

__all__ = [
    "FlagConflictError",
    "FlowNetwork",
    "GraphCycleError",
    "InfeasibleMinCutError",
    "LiveBuffer",
    "MeasuredMemory",
    "MemoryBudgetBestEffortWarning",
    "MemoryStep",
    "MemoryTimeline",
    "MinCut",
    "MinCutOptions",
    "MissingMetadataError",
    "NodeDecision",
    "NodeInfo",
    "OpTypes",
    "PartitionConfig",
    "PartitionDisagreementError",
    "PartitionError",
    "PartitionReport",
    "RegionOutcome",
    "UnreachableMemoryBudgetError",
    "classify",
    "default_op_types",
    "default_partition",
    "draw_graph",
    "explain_partition",
    "get_solver",
    "knapsack",
    "measure_partition",
    "memory_budget_pareto",
    "min_cut_rematerialization_partition",
    "node_nbytes",
    "region_memory_budget",
    "saved_activation_bytes",
    "simulate_joint",
    "simulate_partition",
    "solve_min_cut",
    "write_memory_timeline_png",
]
