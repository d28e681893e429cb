"""Dead-code elimination of the joint graph before partitioning."""

from __future__ import annotations

import torch
import torch.fx as fx


def treats_random_as_impure() -> bool:
    """The ``impure_random`` that fx.Graph.eliminate_dead_code uses (same in 2.11 to 2.15)."""
    if torch._guards.TracingContext.try_get():
        return bool(torch._inductor.config.fallback_random)
    return True


def eliminate_dead_code(graph: fx.Graph) -> bool:
    """fx.Graph.eliminate_dead_code, faster on big graphs; True if anything was dropped.

    fx asks every node whether it is impure, which is slow; nodes with users are kept
    anyway, so only user-less nodes need asking (same result).
    """
    impure_random = treats_random_as_impure()
    # Traced joint graphs rarely hold dead code: when no user-less node could go, skip fx's
    # pass and its whole-graph lint. Graphs with submodules (higher-order ops) always run it,
    # since fx cleans their subgraphs too.
    if not any(not n.users and n.op != "output" and not n.is_impure(impure_random)
               for n in graph.nodes) and not graph.find_nodes(op="get_attr"):
        return False
    return graph.eliminate_dead_code(lambda n: len(n.users) > 0 or n.is_impure(impure_random))

