"""The estimated runtime of a cut's graphs: what its backward recomputes
(``recompute_estimate``) and the whole step (``step_estimate``), from the per-node estimates
(``estimators``) remembered across the cuts of one joint (``NodeEstimates``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch.fx as fx

from .estimators import SignatureMemo, estimate_runtime

__all__ = ["NodeEstimates", "recompute_estimate", "step_estimate"]


class NodeEstimates:
    """``estimate_runtime`` of the nodes of one joint's cuts, remembered by node name.

    Extraction copies a joint node under its name, with its target and its ``meta`` (the same
    ``val`` object), so a copy's estimate is the original's: the cuts of one search share most
    nodes, and each is estimated once per partition instead of once per cut. A name whose
    target or value differs (a node extraction made) is estimated again. The joint's own
    nodes, which a cut's plan lists, are found by identity first.
    """

    def __init__(self, estimator: str | None = None) -> None:
        self.estimator = estimator
        self._by_name: dict[str, tuple[Any, Any, float]] = {}
        self._signatures: SignatureMemo = {}
        self._by_node: dict[fx.Node, tuple[Any, Any, float]] = {}

    def __call__(self, node: fx.Node) -> float:
        val = node.meta.get("val")
        # The same node (a joint node of a cut's plan) first, then its name (a copy).
        found = self._by_node.get(node) or self._by_name.get(node.name)
        if found is not None and found[0] is node.target and found[1] is val:
            return found[2]
        estimate = estimate_runtime(node, self.estimator, signatures=self._signatures)
        self._by_name[node.name] = self._by_node[node] = (node.target, val, estimate)
        return estimate


def recompute_estimate(fw: fx.Graph | Sequence[fx.Node], bw: fx.Graph | Sequence[fx.Node],
                       estimator: str | None = None, estimates: NodeEstimates | None = None) -> float:
    """The estimated runtime the backward spends recomputing: the estimates (``estimator``) of
    the forward nodes that appear again in the backward (same name; extraction, torch's too,
    keeps the joint's names). A formula that scores any partitioner's graphs alike.
    ``estimates``: a memo of the same estimator shared by the cuts of one joint."""
    estimate = estimates if estimates is not None else NodeEstimates(estimator)
    forward = {n.name for n in _nodes_of(fw) if n.op == "call_function"}
    return float(sum(estimate(n) for n in _nodes_of(bw)
                     if n.op == "call_function" and n.name in forward))


def step_estimate(fw: fx.Graph | Sequence[fx.Node], bw: fx.Graph | Sequence[fx.Node],
                  estimator: str | None = None, estimates: NodeEstimates | None = None) -> float:
    """The estimated runtime of one forward+backward step: the estimates (``estimator``) of
    every call in both graphs, before the RNG replay (a replayed random op counts as itself).
    ``estimates``: a memo of the same estimator shared by the cuts of one joint."""
    estimate = estimates if estimates is not None else NodeEstimates(estimator)
    return float(sum(estimate(n) for graph in (fw, bw) for n in _nodes_of(graph)
                     if n.op == "call_function"))


def _nodes_of(graph: fx.Graph | Sequence[fx.Node]) -> Iterable[fx.Node]:
    """A graph's nodes, or a plan's list of them (extract.CutPlan: the joint nodes the
    graph's copies would be; a copy's estimate is its original's, see NodeEstimates)."""
    return graph.nodes if isinstance(graph, fx.Graph) else graph
