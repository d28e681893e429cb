"""What a partition did and what it could do: the report and its per-node decisions
(``report``), the memory-budget Pareto sweep (``pareto``), pictures of the graph (``draw``) and of
the memory timeline (``memory_plot``), and TORCH_TRACE pages (``trace``).

``PartitionReport`` and ``NodeDecision`` (the old module ``aot_partition.report``'s names) are
re-exported here; loading them imports torch, so they load on first use.
"""

from __future__ import annotations

from .. import _fx_extra  # noqa: F401 - first: without torch, an error naming the extra

# isort: split

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .report import NodeDecision, PartitionReport

__all__ = ["NodeDecision", "PartitionReport"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".report", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
