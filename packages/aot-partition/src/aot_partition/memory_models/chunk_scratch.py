"""One lowering for a graph at every chunk count of the split's ops.

The split (split/) replaces a loss or an MLP with a custom op that takes its number of chunks
as its last argument. Inductor lowers that op as one extern call: the chunk count changes the
op's scratch (one chunk's logits, its projection's temporaries), which the memory model adds
from the shapes (``Workspace`` events), and nothing else of the lowered program. A peak cap
that tries the split at 2, 4, 8 ... chunks prices the same cuts of the same graph once per
count: the lowering memo (lowering_memo.py) keys a graph without its chunk counts, and the
scratch of each chunked call is worked out again, for the counts of the graph being priced,
whether the lowering was just made or kept from another count.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch.fx as fx

__all__ = ["ChunkScratch", "chunk_counts", "chunk_counts_hidden", "chunked_calls", "chunked_ops",
           "rescratched", "scratch_bytes", "tensor_inputs"]

# What the key sees in place of a chunk count: no real call has it (counts are >= 1).
_HIDDEN = -1


@dataclasses.dataclass(frozen=True)
class ChunkScratch:
    """Where a chunked call's scratch goes in a lowered graph's events: at ``position`` (a
    ``Workspace`` event there when ``present``: more than 0 bytes), for the ``ordinal``-th
    chunked call of the graph, its tensor inputs laid out as ``strides`` says (in the order of
    its arguments; None: the value's own); ``with_outputs``: the op's outputs count in it (a
    multi-output call, its items bound after it)."""

    position: int
    ordinal: int
    strides: tuple[tuple[int, ...] | None, ...]
    with_outputs: bool
    label: str
    present: bool


def chunked_ops() -> tuple[Any, ...]:
    from ..split.chunked_loss import CHUNKED_OPS
    from ..split.chunked_mlp import CHUNKED_OPS as CHUNKED_MLP_OPS

    return (*CHUNKED_OPS, *CHUNKED_MLP_OPS)


def chunked_calls(graph: fx.Graph) -> list[fx.Node]:
    """The split's op calls of ``graph``, in order."""
    ops = chunked_ops()
    return [n for n in graph.nodes if n.op == "call_function" and n.target in ops]


def _chunks_index(target: Any) -> int:
    return [argument.name for argument in target._schema.arguments].index("chunks")


def chunk_counts(gm: fx.GraphModule) -> tuple[Any, ...]:
    """Each chunked call's chunk count, in order."""
    counts = []
    for node in chunked_calls(gm.graph):
        index = _chunks_index(node.target)
        counts.append(node.args[index] if len(node.args) > index else node.kwargs.get("chunks"))
    return tuple(counts)


@contextlib.contextmanager
def chunk_counts_hidden(gm: fx.GraphModule) -> Iterator[None]:
    """``gm``'s code with every chunked call's chunk count replaced by one value (for a key),
    restored on exit."""
    changed: list[tuple[fx.Node, Any, dict[str, Any]]] = []
    for node in chunked_calls(gm.graph):
        index = _chunks_index(node.target)
        args, kwargs = node.args, dict(node.kwargs)
        if len(args) > index:
            node.args = (*args[:index], _HIDDEN, *args[index + 1:])
        else:
            node.kwargs = {**kwargs, "chunks": _HIDDEN}
        changed.append((node, args, kwargs))
    if not changed:
        yield
        return
    gm.recompile()
    try:
        yield
    finally:
        for node, args, kwargs in changed:
            node.args, node.kwargs = args, kwargs
        gm.recompile()


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """``node``'s arguments that are tensors, in order."""
    import torch
    import torch.utils._pytree as pytree

    return [a for a in pytree.tree_leaves((node.args, node.kwargs))
            if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]


def scratch_bytes(origin: fx.Node, strides: dict[fx.Node, tuple[int, ...]],
                  with_outputs: bool) -> int:
    """What a call of ``origin``'s op allocates inside (``simulator.profiled_workspace``) with
    its inputs laid out as ``strides`` says, its outputs too when ``with_outputs`` (0 when it
    allocates nothing inside)."""
    import torch
    import torch.utils._pytree as pytree

    from ..fx.sizes import tensor_nbytes
    from .simulator import profiled_workspace

    nbytes = profiled_workspace(origin, strides)
    if nbytes and with_outputs:
        nbytes += sum(tensor_nbytes(v) for v in pytree.tree_leaves(origin.meta["val"])
                      if isinstance(v, torch.Tensor))
    return nbytes


def rescratched(events: Sequence[Any], slots: Sequence[ChunkScratch], gm: fx.GraphModule,
                workspace: Any) -> tuple[tuple[Any, ...], tuple[ChunkScratch, ...]]:
    """``events`` (a lowering's, ``slots`` its chunked calls) with each chunked call's scratch
    worked out again for ``gm``'s calls (the same graph at other chunk counts: its
    ``ordinal``-th chunked call for each slot); ``workspace(label, nbytes)`` makes an event."""
    calls = chunked_calls(gm.graph)
    present = {slot.position for slot in slots if slot.present}
    base = [event for i, event in enumerate(events) if i not in present]
    out: list[Any] = []
    new_slots: list[ChunkScratch] = []
    taken = removed = 0
    for slot in sorted(slots, key=lambda s: s.position):
        upto = slot.position - removed
        out.extend(base[taken:upto])
        taken = upto
        call = calls[slot.ordinal]
        laid_out = {leaf: stride for leaf, stride in zip(tensor_inputs(call), slot.strides)
                    if stride is not None}
        nbytes = scratch_bytes(call, laid_out, slot.with_outputs)
        new_slots.append(dataclasses.replace(slot, position=len(out), present=nbytes > 0))
        if nbytes:
            out.append(workspace(slot.label, nbytes))
        if slot.present:
            removed += 1
    out.extend(base[taken:])
    return tuple(out), tuple(new_slots)
