"""Differences between the supported torch releases (2.11 to 2.15), kept in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx._lazy_graph_module import _make_graph_module
from torch.fx.experimental import symbolic_shapes

# torch 2.13 renamed ``hint_int`` to ``optimization_hint``; 2.11 has only the old name. Both
# take ``(value, fallback=...)`` and return a concrete int without adding guards. The one
# caller is ``sizes.size_hint``, which picks the fallback.
optimization_hint: Callable[..., int] = next(
    getattr(symbolic_shapes, name) for name in ("optimization_hint", "hint_int")
    if hasattr(symbolic_shapes, name))


def saved_output_descs(num_saved: int) -> list[Any] | None:
    """AOTAutograd output descriptors for saved activations, or None where torch has none."""
    try:
        from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
    except ImportError:  # pragma: no cover - every supported release has them
        return None
    return [SavedForBackwardsAOTOutput(i) for i in range(num_saved)]


def saved_output_desc_type() -> type | None:
    try:
        from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
    except ImportError:  # pragma: no cover
        return None
    return SavedForBackwardsAOTOutput


def make_graph_module(root: torch.nn.Module, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule of the class torch would build here: lazy (code generated on first use)
    inside torch.compile, whose ``use_lazy_graph_module`` setting picks it, eager elsewhere.

    Generating Python code for a 5,000-node graph takes ~0.1 s; Inductor never needs it."""
    return _make_graph_module(root, graph)
