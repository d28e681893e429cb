"""One cut of the joint as the partition builds it: the forward and backward graphs cut at a
saved set (``extract_cut``), then the passes the partition runs on them (``finish_cut``: RNG
replay, the backward reordered). Shared by the min-cut partition's caps and by
``default_partition`` on checkpoint-tagged joints (``checkpoint_split``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node

from .extract import CutPlan, extract_forward_backward_graphs, is_assert_only_symbool
from .passes import reorder_backward, replay_random_ops

__all__ = ["CutGraphs", "extract_cut", "finish_cut", "split_saved"]


@dataclass
class CutGraphs:
    """The forward and backward graphs of one cut, as the partition builds them (no code)."""

    fw: fx.Graph
    bw: fx.Graph
    saved_values: list[fx.Node]
    saved_sym_nodes: list[fx.Node]
    replayed: list[str] = field(default_factory=list)  # random ops replaying the fw's RNG


def split_saved(chosen: Sequence[fx.Node]) -> tuple[list[fx.Node], list[fx.Node]]:
    """(saved symbolic scalars, saved values) of a chosen set, as the partition splits them."""
    return ([n for n in chosen if is_sym_node(n) and not is_assert_only_symbool(n)],
            [n for n in chosen if not is_sym_node(n)])


def extract_cut(joint_module: fx.GraphModule, chosen: Sequence[fx.Node], *,
                num_fwd_outputs: int,
                known_live: Mapping[frozenset[fx.Node], set[fx.Node]] | None = None,
                plan: CutPlan | None = None) -> CutGraphs:
    """Cut the joint at ``chosen`` (tensors and symbolic scalars): bare graphs, no passes.
    ``known_live`` and ``plan``: see ``extract_forward_backward_graphs``."""
    saved_sym_nodes, saved_values = split_saved(chosen)
    fw, bw, saved_values, saved_sym_nodes = extract_forward_backward_graphs(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs,
        known_live=known_live, plan=plan)
    return CutGraphs(fw, bw, saved_values, saved_sym_nodes)


def finish_cut(cut: CutGraphs) -> CutGraphs:
    """The passes the partition runs on a cut's graphs, in place: RNG replay, then the backward
    reordered like the autograd engine runs it. Returns ``cut``."""
    # Recompute must be a pure replay: every random op run again in the backward replays the
    # forward's RNG state, whatever made it recomputed.
    cut.replayed = replay_random_ops(cut.fw, cut.bw, len(cut.saved_sym_nodes))
    reorder_backward(cut.bw)
    return cut
