"""aot_partition: forward/backward partitioners for AOTAutograd joint graphs.

``default_partition`` and ``min_cut_rematerialization_partition`` have torch's partition_fn
signature. Flags come from ``aot_config.functorch``.
"""

from __future__ import annotations

from typing import Any

from .classify import NodeInfo, OpTypes, classify, default_op_types
from .errors import (
    GraphCycleError,
    InfeasibleMinCutError,
    MissingMetadataError,
    PartitionError,
)
from .mincut import FlowNetwork, MinCut, get_solver
from .partitioners import default_partition, min_cut_rematerialization_partition
from .policy import MinCutOptions
from .report import NodeDecision, PartitionReport, explain_partition
from .sizes import node_nbytes, saved_activation_bytes
from .solve import solve_min_cut

__all__ = [
    "FlowNetwork",
    "GraphCycleError",
    "InfeasibleMinCutError",
    "MinCut",
    "MinCutOptions",
    "MissingMetadataError",
    "NodeDecision",
    "NodeInfo",
    "OpTypes",
    "PartitionError",
    "PartitionReport",
    "classify",
    "default_op_types",
    "default_partition",
    "draw_graph",
    "explain_partition",
    "get_solver",
    "knapsack",
    "memory_budget_pareto",
    "min_cut_rematerialization_partition",
    "node_nbytes",
    "saved_activation_bytes",
    "solve_min_cut",
]

# Optional pieces (they may need extras such as pydot or matplotlib): imported on first use,
# so a missing extra never breaks ``import aot_partition``.
_LAZY = {
    "knapsack": ("aot_partition.knapsack", None),
    "draw_graph": ("aot_partition.draw", "draw_graph"),
    "memory_budget_pareto": ("aot_partition.pareto", "memory_budget_pareto"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'aot_partition' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
