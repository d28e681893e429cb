"""Functional collectives in a joint graph: which nodes they are, why they are never recomputed,
and what they cost.

A collective (an op of the ``_c10d_functional`` namespaces: ``all_reduce``,
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``, ``broadcast``, their
coalesced forms, and the ``wait_tensor`` that completes each) is never recomputed unless the flag
``allow_recompute_collectives`` says so: recomputing it repeats its network traffic in the
backward, and if the ranks' partitions differ, one rank issues a collective the others never
join (a deadlock).

Its cost is priced, never measured: running a collective to time it would be a side effect on
the user's process group at compile time (and a deadlock when ranks profile different nodes).
``collective_seconds`` is the bytes it puts on the wire over ``collective_bandwidth_gbps``
(ring algorithms: an all-reduce sends its payload twice, the others once, each times
(p - 1) / p for a group of p ranks when the op names its group size). A ``wait_tensor`` costs 0:
the transfer is priced at the collective.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..core.rules import COLLECTIVE_REASON
from .sizes import tensor_nbytes

__all__ = [
    "COLLECTIVE_NAMESPACES",
    "COLLECTIVE_REASON",
    "collective_seconds",
    "is_collective",
    "wire_bytes",
]

# torch's functional collectives (the legacy namespace and the autograd-aware one included).
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional",
                                   "_c10d_functional_autograd"})
GB = 1e9


def is_collective(node: fx.Node) -> bool:
    """A functional collective or its wait (a ``call_function`` of a c10d functional op)."""
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace in COLLECTIVE_NAMESPACES)


def _values_nbytes(tree: object) -> int:
    return sum(tensor_nbytes(v) for v in pytree.tree_leaves(tree) if isinstance(v, torch.Tensor))


def _argument(node: fx.Node, name: str) -> object:
    """The argument ``name`` of an OpOverload call, positional or keyword (None if absent)."""
    assert isinstance(node.target, torch._ops.OpOverload)
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name)
    return None


def _input_nbytes(node: fx.Node) -> int:
    values = [a.meta.get("val") for a in node.all_input_nodes]
    return _values_nbytes(values)


def wire_bytes(node: fx.Node) -> float:
    """Bytes a collective sends per rank (ring algorithms); 0 for a wait or a non-collective."""
    if not is_collective(node):
        return 0.0
    assert isinstance(node.target, torch._ops.OpOverload)
    name = node.target._schema.name.split("::")[-1]
    if name.startswith("wait_tensor"):
        return 0.0
    group_size = _argument(node, "group_size")
    share = (group_size - 1) / group_size if isinstance(group_size, int) and group_size > 0 else 1.0
    if name.startswith("all_gather"):  # the gathered output arrives; its (p-1)/p is remote
        return share * _values_nbytes(node.meta.get("val"))
    if name.startswith("all_reduce"):  # reduce-scatter, then all-gather: the payload twice
        return 2.0 * share * _input_nbytes(node)
    if name.startswith("broadcast"):
        return float(_input_nbytes(node))
    return share * _input_nbytes(node)  # reduce_scatter, all_to_all, anything else


def collective_seconds(node: fx.Node, bandwidth_gbps: float) -> float:
    """Seconds ``node``'s transfer takes at ``bandwidth_gbps`` GB/s (0 for a wait)."""
    if not bandwidth_gbps > 0:
        raise ValueError(f"collective bandwidth must be a positive number of GB/s, got "
                         f"{bandwidth_gbps!r} (flag collective_bandwidth_gbps)")
    return wire_bytes(node) / (bandwidth_gbps * GB)
