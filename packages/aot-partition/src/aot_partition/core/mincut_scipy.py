"""Min-cut on arrays with ``scipy.sparse.csgraph.maximum_flow`` (the "scipy" solver).

scipy's max-flow works on int32 capacities. Whole-number capacities whose sum fits in
``FINITE_CAPACITY_TOTAL`` are used as they are (exact, so tied cuts stay tied); otherwise finite
capacities are scaled until their sum is ``FINITE_CAPACITY_TOTAL`` and rounded (monotone, so the
order of capacities is kept; a positive capacity never rounds to 0); infinite ones become
``INFINITE_CAPACITY``, larger than every finite cut. The sink side is read off the residual graph
by a breadth-first search from the sink (every node that can still reach it), the source side is
the rest (among tied cuts, the largest source side: networkx's), and the cut value is reported in
the network's original units from the original capacities of the cut edges.

scipy is imported at the first network that needs it. Small networks
(``SMALL_NETWORK_MAX_EDGES``) always take the plain-Python flow of ``mincut_small``; until
scipy's graph module is loaded (by anything in the process), networks of up to
``COLD_NETWORK_MAX_EDGES`` take it too, while the time spent there stays under
``COLD_FLOW_BUDGET_S``: importing scipy's sparse graph code costs 0.2-0.3 s, more than the
flows of a cold compile of small graphs. The cut is the same either way (see mincut_small).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
import time
from typing import Any

import numpy as np

from .mincut import FlowNetwork, MinCut
from .mincut_small import SMALL_NETWORK_MAX_EDGES, reachable_small, sink_side_small

if importlib.util.find_spec("scipy") is None:  # the "scipy" solver falls back to networkx
    raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

log = logging.getLogger(__name__)

__all__ = ["scipy_min_cut", "FINITE_CAPACITY_TOTAL", "INFINITE_CAPACITY"]

# Headroom below int32's 2**31: the sum of all finite scaled capacities bounds every finite flow.
FINITE_CAPACITY_TOTAL = 2**29
INFINITE_CAPACITY = 2**30
# Before scipy's graph module is loaded: networks up to this many edges take the Python flow
# (about 5 ms at 900 edges, against scipy's 0.5 ms once imported) ...
COLD_NETWORK_MAX_EDGES = 1024
# ... until these flows have cost this much in the process (then scipy is imported).
COLD_FLOW_BUDGET_S = 0.25
_cold_flow_s = 0.0


def _sparse() -> Any:
    """``scipy.sparse`` with its ``csgraph`` loaded, imported on first use."""
    import scipy.sparse.csgraph

    return scipy.sparse


def _reachable(num_nodes: int, tails: np.ndarray, heads: np.ndarray, start: int) -> np.ndarray:
    seen = np.zeros(num_nodes, dtype=bool)
    if tails.size == 0:
        seen[start] = True
        return seen
    sparse = _sparse()
    graph = sparse.csr_matrix((np.ones(tails.size, dtype=np.int8), (tails, heads)),
                              shape=(num_nodes, num_nodes))
    order = sparse.csgraph.breadth_first_order(graph, start, directed=True,
                                               return_predecessors=False)
    seen[order] = True
    return seen


def takes_python_flow(num_edges: int) -> bool:
    """Whether a network of ``num_edges`` distinct edges takes the plain-Python flow now."""
    if num_edges <= SMALL_NETWORK_MAX_EDGES:
        return True
    return (num_edges <= COLD_NETWORK_MAX_EDGES and _cold_flow_s < COLD_FLOW_BUDGET_S
            and "scipy.sparse.csgraph" not in sys.modules)


def _scale(capacities: np.ndarray, infinite: np.ndarray) -> np.ndarray:
    finite = capacities[~infinite]
    total = float(finite.sum()) if finite.size else 0.0
    scaled = np.zeros(capacities.size, dtype=np.int64)
    if 0 < total <= FINITE_CAPACITY_TOTAL and np.array_equal(finite, np.floor(finite)):
        # Whole numbers (bytes, as the network builder makes them) that fit: exact, so a tie
        # between cuts stays a tie for the tie-break below (networkx's cut).
        scaled[~infinite] = finite.astype(np.int64)
    elif total > 0:
        factor = FINITE_CAPACITY_TOTAL / total
        rounded = np.floor(finite * factor + 0.5).astype(np.int64)
        # Tiny positive capacities must stay positive: 0 would make cutting them free.
        scaled[~infinite] = np.where(finite > 0, np.maximum(rounded, 1), 0)
    scaled[infinite] = INFINITE_CAPACITY
    return scaled


def scipy_min_cut(network: FlowNetwork) -> MinCut:
    """A minimum source/sink cut of ``network`` (see module doc for the quantization)."""
    n = int(network.num_nodes)
    source, sink = int(network.source), int(network.sink)
    tails = np.asarray(network.tails, dtype=np.int64)
    heads = np.asarray(network.heads, dtype=np.int64)
    capacities = np.asarray(network.capacities, dtype=np.float64)
    if not (tails.shape == heads.shape == capacities.shape):
        raise ValueError(f"FlowNetwork arrays differ in length: tails {tails.shape}, "
                         f"heads {heads.shape}, capacities {capacities.shape}")
    if capacities.size and (np.isnan(capacities).any() or capacities.min() < 0):
        raise ValueError("FlowNetwork capacities must be >= 0 (math.inf for infinite)")
    if source == sink:
        raise ValueError(f"FlowNetwork source and sink are the same node ({source})")
    infinite = np.isinf(capacities)
    # Self-loops carry no flow; scipy rejects them. Parallel edges are summed by csr_matrix.
    keep = tails != heads
    tails_k, heads_k = tails[keep], heads[keep]
    python_flow = takes_python_flow(int(tails_k.size))
    started = time.perf_counter()

    # A path of infinite edges makes every cut infinite; max-flow would overflow int32 on it.
    through_infinite = (reachable_small if python_flow else _reachable)(
        n, tails[infinite], heads[infinite], source)
    if through_infinite[sink]:
        # Debug, not a warning: the caller raises an error that shows the path (no stray
        # line on stderr before it).
        log.debug("min cut: the sink is reachable from the source through infinite edges")
        through_infinite[sink] = False  # keep the MinCut invariant: the sink is never source-side
        return MinCut(value=math.inf, source_side=through_infinite)

    scaled = np.minimum(_scale(capacities[keep], infinite[keep]), INFINITE_CAPACITY)
    if python_flow:  # scipy's set-up (or import) would cost more than the flow
        global _cold_flow_s
        summed: dict[tuple[int, int], int] = {}
        for edge in zip(tails_k.tolist(), heads_k.tolist(), scaled.tolist()):
            summed[edge[:2]] = summed.get(edge[:2], 0) + edge[2]
        capped = {edge: min(cap, INFINITE_CAPACITY) for edge, cap in summed.items()}
        sink_side = sink_side_small(n, source, sink, capped)
        if tails_k.size > SMALL_NETWORK_MAX_EDGES:
            _cold_flow_s += time.perf_counter() - started
        return _cut_of(tails, heads, capacities, ~sink_side)
    sparse = _sparse()
    graph = sparse.csr_matrix((scaled, (tails_k, heads_k)), shape=(n, n))
    graph.sum_duplicates()
    graph.data = np.minimum(graph.data, INFINITE_CAPACITY).astype(np.int32)
    flow = sparse.csgraph.maximum_flow(graph, source, sink).flow

    # Residual capacity: capacity - flow on forward edges, plus flow on reverse edges.
    residual = (graph.astype(np.int64) - flow.astype(np.int64)).tocoo()
    open_edges = residual.data > 0
    # The sink side is every node that can still reach the sink (a search from the sink over
    # reversed residual edges); the source side is the rest. Where several cuts tie, that is
    # the largest source side, the one networkx's minimum_cut (and so torch) returns.
    sink_side = _reachable(n, residual.col[open_edges].astype(np.int64),
                           residual.row[open_edges].astype(np.int64), sink)
    return _cut_of(tails, heads, capacities, ~sink_side)


def _cut_of(tails: np.ndarray, heads: np.ndarray, capacities: np.ndarray,
            source_side: np.ndarray) -> MinCut:
    """The cut with ``source_side``, its value from the original capacities of its edges."""
    crossing = source_side[tails] & ~source_side[heads]
    value = float(capacities[crossing].sum()) if crossing.any() else 0.0
    return MinCut(value=value, source_side=source_side)
