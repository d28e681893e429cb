"""How our split and torch's own chunkers share one joint graph.

Inductor's ``auto_chunker`` (``torch._inductor.config.auto_chunker.enable``) rewrites the joint
graph before any partitioner sees it: from a node whose output amplifies its inputs (the LM
head's logits) it computes the rest of the step in chunks, each an ``invoke_subgraph`` call of
one chunk subgraph (``chunking_subgraph_*``) that Inductor compiles once and cannot fuse across.
Our split rewrites the Dynamo graph earlier: the head and its loss become one call of
``torch.ops.aot_partition.linear_cross_entropy``, whose output (the loss) amplifies nothing, so
the chunker finds no amplifier there and leaves it. One plan either way: with ``split`` on the
split takes the head; with it off the chunker may. ``describe`` says which, for the log.

``F.linear_cross_entropy`` with ``LinearCrossEntropyOptions`` in user code is traced chunk by
chunk; the partitioner keeps its chunks (it never joins nodes), and Inductor's fusion stays
within them.
"""

from __future__ import annotations

import torch
import torch.fx as fx

CHUNK_SUBGRAPH_PREFIX = "chunking_subgraph"


def auto_chunker_enabled() -> bool:
    from torch._inductor import config

    chunker = getattr(config, "auto_chunker", None)  # torch 2.13 on
    return bool(chunker is not None and chunker.enable)


def chunk_calls(graph: fx.Graph) -> int:
    """How many chunk calls the auto_chunker left in ``graph``."""
    invoke = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    if invoke is None:
        return 0
    count = 0
    for node in graph.find_nodes(op="call_function", target=invoke):
        subgraph = node.args[0] if node.args else None
        if isinstance(subgraph, fx.Node) and str(subgraph.target).startswith(
                CHUNK_SUBGRAPH_PREFIX):
            count += 1
    return count


def split_calls(graph: fx.Graph) -> int:
    """How many chunked-loss calls of our split are in ``graph``."""
    from aot_partition.split.chunked_loss import CHUNKED_OPS

    return sum(len(graph.find_nodes(op="call_function", target=op)) for op in CHUNKED_OPS)


def describe(graph: fx.Graph) -> str | None:
    """Which chunker took the joint's head, in one line; None when auto_chunker is off and it
    left no chunk calls (nothing to say)."""
    chunks, splits = chunk_calls(graph), split_calls(graph)
    if chunks:
        return (f"Inductor's auto_chunker chunked this joint ({chunks} chunk calls); our "
                "partitioner keeps its chunks")
    if not auto_chunker_enabled():
        return None
    if splits:
        return ("our split took the LM head and its loss; Inductor's auto_chunker left them "
                "(the chunked loss amplifies nothing)")
    return "Inductor's auto_chunker is on and found nothing to chunk in this joint"
