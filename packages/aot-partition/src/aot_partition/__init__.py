"""aot_partition: forward/backward partitioners for AOTAutograd joint graphs.

``default_partition`` and ``min_cut_rematerialization_partition`` have torch's partition_fn
signature. Flags come from ``aot_config.functorch``, read once per call into a
``PartitionConfig`` (or pass ``config=``). The optional extras (pydot for
``draw_graph``, matplotlib for Pareto plots) are imported only when a picture is drawn.

Attributes are loaded on first use (PEP 562): ``import aot_partition.core`` (the graph-agnostic
min-cut, numpy/scipy only) loads no torch; the torch.fx front end is imported only when one of
its names is first read. torch is the extra ``fx`` (``pip install 'aot-partition[fx]'``): without
it, reading a front-end name raises ImportError saying so.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from . import _moved

if TYPE_CHECKING:
    from .budget.regions import RegionOutcome
    from .config import PartitionConfig
    from .core import knapsack
    from .core.mincut import FlowNetwork, MinCut, get_solver
    from .errors import (
        FlagConflictError,
        GraphCycleError,
        InfeasibleMinCutError,
        MissingMetadataError,
        PartitionDisagreementError,
        PartitionError,
        UnreachableMemoryBudgetError,
    )
    from .fx.classify import NodeInfo, OpTypes, classify, default_op_types
    from .fx.policy import MinCutOptions
    from .fx.regions import region_memory_budget
    from .fx.sizes import node_nbytes, saved_activation_bytes, saved_bytes
    from .fx.solve import solve_min_cut
    from .memory_models.simulator import (
        LiveBuffer,
        MeasuredMemory,
        MemoryStep,
        MemoryTimeline,
        measure_partition,
        simulate_joint,
        simulate_partition,
    )
    from .partitioners import (
        MemoryBudgetBestEffortWarning,
        default_partition,
        explain_partition,
        min_cut_rematerialization_partition,
        partition_with_report,
    )
    from .report.draw import draw_graph
    from .report.memory_plot import write_memory_timeline_png
    from .report.pareto import memory_budget_pareto
    from .report.report import GivenBudget, NodeDecision, PartitionReport

# public submodules
_PUBLIC_SUBMODULES = {"knapsack": ".core.knapsack"}

# public name -> the module (relative to this package) that defines it
_LAZY_ATTRIBUTES: dict[str, str] = {
    "NodeInfo": ".fx.classify",
    "OpTypes": ".fx.classify",
    "classify": ".fx.classify",
    "default_op_types": ".fx.classify",
    "PartitionConfig": ".config",
    "draw_graph": ".report.draw",
    "FlagConflictError": ".errors",
    "GraphCycleError": ".errors",
    "InfeasibleMinCutError": ".errors",
    "MissingMetadataError": ".errors",
    "PartitionDisagreementError": ".errors",
    "PartitionError": ".errors",
    "UnreachableMemoryBudgetError": ".errors",
    "LiveBuffer": ".memory_models.simulator",
    "MeasuredMemory": ".memory_models.simulator",
    "MemoryStep": ".memory_models.simulator",
    "MemoryTimeline": ".memory_models.simulator",
    "measure_partition": ".memory_models.simulator",
    "simulate_joint": ".memory_models.simulator",
    "simulate_partition": ".memory_models.simulator",
    "write_memory_timeline_png": ".report.memory_plot",
    "FlowNetwork": ".core.mincut",
    "MinCut": ".core.mincut",
    "get_solver": ".core.mincut",
    "memory_budget_pareto": ".report.pareto",
    "MemoryBudgetBestEffortWarning": ".partitioners",
    "default_partition": ".partitioners",
    "explain_partition": ".partitioners",
    "min_cut_rematerialization_partition": ".partitioners",
    "partition_with_report": ".partitioners",
    "MinCutOptions": ".fx.policy",
    "RegionOutcome": ".budget.regions",
    "region_memory_budget": ".fx.regions",
    "GivenBudget": ".report.report",
    "NodeDecision": ".report.report",
    "PartitionReport": ".report.report",
    "node_nbytes": ".fx.sizes",
    "saved_activation_bytes": ".fx.sizes",
    "saved_bytes": ".fx.sizes",
    "solve_min_cut": ".fx.solve",
}

__all__ = [
    "FlagConflictError",
    "FlowNetwork",
    "GivenBudget",
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
    "partition_with_report",
    "region_memory_budget",
    "saved_activation_bytes",
    "saved_bytes",
    "simulate_joint",
    "simulate_partition",
    "solve_min_cut",
    "write_memory_timeline_png",
]


# The torch.fx front end's names need torch, which the core does not: it is an extra.
FX_EXTRA_HINT = ("aot_partition.{name} needs torch (the torch.fx front end): pip install "
                 "'aot-partition[fx]'. The core, aot_partition.core, needs no torch.")


def _torch_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_SUBMODULES:
        value: Any = importlib.import_module(_PUBLIC_SUBMODULES[name], __name__)
    elif name in _LAZY_ATTRIBUTES:
        try:
            module = importlib.import_module(_LAZY_ATTRIBUTES[name], __name__)
        except ImportError as error:
            if _torch_importable():
                raise
            raise ImportError(FX_EXTRA_HINT.format(name=name)) from error
        value = getattr(module, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later reads skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _PublicNamesWin(types.ModuleType):
    """Keeps ``aot_partition.fx.classify`` the function, as the eager imports did.

    Importing a submodule binds it on its package; the submodule ``classify`` would then hide
    the public function of the same name whenever another module imported it first.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _LAZY_ATTRIBUTES:
            return  # a (moved) submodule named like a public name: the name stays lazy
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PublicNamesWin
_moved.install()
