"""The joint graph made ready for partitioning, and given back as it came afterwards.

``prepared_joint`` runs the passes every min-cut partition (and a Pareto sweep) starts with:
the topological-order check, values for tuple-valued calls that lack them (an auto-chunked
joint's first ``invoke_subgraph``: ``joint.complete_tuple_values``), dead-code elimination, common-subexpression merging, MUST_SAVE
for readers of inputs mutated in place, and the checkpoint-tag clean-up. The merge is undone
on the way out, also when the partition raises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch.fx as fx

from ..config import PartitionConfig
from .joint import (
    ancestors_within,
    check_topological_order,
    complete_tuple_values,
    forward_and_backward_outputs,
)
from .passes import (
    cleanup_recompute_tags,
    eliminate_dead_code,
    has_recomputable_ops,
    merge_common_subexpressions,
    save_readers_of_mutated_inputs,
)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def prepared_joint(joint_module: fx.GraphModule, num_fwd_outputs: int, *,
                   config: PartitionConfig | None = None) -> Iterator[fx.GraphModule]:
    """The joint with dead code dropped and common subexpressions merged while partitioning.

    The merge is undone on the way out, so the caller's module keeps the graph its code was
    generated from; torch instead regenerates the joint's code, costly on big graphs when
    the module is not lazy (a direct aot_function call). Dead code is rare in traced joints
    and stays dropped (one code generation then). Annotations written by the passes
    (MUST_SAVE for readers of mutated inputs, region boundaries) stay too. ``config.cse``
    (default: the flag now) switches the merge.
    """
    config = config if config is not None else PartitionConfig.from_flags()
    graph = joint_module.graph
    check_topological_order(graph)
    completed = complete_tuple_values(graph)  # metadata only: it stays
    if completed:
        log.debug("values completed from their getitem users: %s",
                  ", ".join(n.name for n in completed))
    if eliminate_dead_code(graph):
        joint_module.recompile()
    merged = None
    if config.cse:
        # A forward-only value merged with its backward twin would become one more saved
        # value (torch 2.15 fixed this the same way): keep the two sides apart.
        _, bw_outputs, _, _ = forward_and_backward_outputs(joint_module, num_fwd_outputs)
        needed_by_backward = ancestors_within(bw_outputs, set(graph.nodes))
        merged = merge_common_subexpressions(graph, needed_by_backward.__contains__)
    try:
        save_readers_of_mutated_inputs(graph)
        if has_recomputable_ops(graph):
            cleanup_recompute_tags(graph)
        yield joint_module
    finally:
        if merged is not None:
            merged.undo()
