"""Dead-code elimination of the joint graph before partitioning."""

from __future__ import annotations

import torch.fx as fx


def eliminate_dead_code(module: fx.GraphModule) -> fx.GraphModule:
    """Drop nodes nobody uses (impure ops such as in-place copies are kept by fx)."""
    if module.graph.eliminate_dead_code():
        module.recompile()
    return module
