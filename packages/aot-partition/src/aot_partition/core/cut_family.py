"""The min cuts of one graph's network under many ban sets, each solved on what is left to decide.

A budget search cuts one network again and again; only the bans differ (``source -> n_in``
edges of infinite capacity), and its cuts are the "scipy" solver's: the sink side is every node
that can still reach the sink in the residual graph of a maximum flow, the same for every
maximum flow (mincut_small.py). ``CutFamily.cut`` answers exactly what
``partition_banned(..., solver="scipy")`` answers, with less work where earlier cuts say
something:

- Nested bans give nested cuts. If bans ``A`` are a subset of ``B``, ``T(B)`` (the sink side
  under ``B``) is a subset of ``T(A)``: adding infinite source edges only grows the source
  side (the cut function is submodular, and the answer is the largest source side among the
  minimum cuts). So every solved cut whose bans are a subset of the new bans fixes its source
  side (and the new banned inputs) on the source side, and every solved cut whose bans are a
  superset fixes its sink side on the sink side. Only the nodes in between are left: they are
  solved on the contracted network (the fixed sides merged into the source and the sink), which
  has the same minimum cuts in between and the same residual reachability, so the same answer.
  A bisection over nested ban sets (the refinement's) solves ever smaller networks; where the
  bounds meet, no flow is run at all.
- The same effect, measured once. A cut solved on the whole network keeps its flow on the ban
  edges. A new ban set whose added bans all sit on that cut's source side and whose lifted bans
  all carried no flow has the same maximum flow and residual graph, so the same cut: it is
  reused without a flow.

The capacities are the scipy solver's integers, scaled once for the whole network (the bans
do not change the finite capacities), so a contracted network rounds as the whole one does.
Feasibility is known where a feasible superset of the bans was solved (lifting bans never
makes a path of infinite edges); otherwise the whole network is solved, its paths of infinite
edges checked first, as the solver does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from .graph import SINK, SOURCE, CoreGraph, CorePartition, build_network, partition_banned
from .mincut import MinCut
from .mincut_scipy import INFINITE_CAPACITY, _reachable, _scale, _sparse, takes_python_flow

log = logging.getLogger(__name__)

__all__ = ["CutFamily"]

# Bounds taken from at most this many solved cuts on each side (the closest).
BOUNDS = 4


@dataclass(frozen=True)
class _Solved:
    banned: np.ndarray        # bool [graph nodes]
    packed: np.ndarray        # the same, bit-packed (uint8): subset tests over many cuts
    sink_side: np.ndarray     # bool [network nodes]
    ban_flow: np.ndarray | None   # per graph node, the flow on its ban edge (whole solves only)


class CutFamily:
    """``partition_banned(graph, banned, solver="scipy", ...)`` for many ``banned``, reusing
    what the cuts solved before say (module doc). Counts: ``flows`` (max-flows run),
    ``reused`` (cuts answered without a flow)."""

    def __init__(self, graph: CoreGraph, *, recompute_views: bool, parameters_are_free: bool,
                 priced_by_bytes: bool) -> None:
        self.graph = graph
        self.options = {"recompute_views": recompute_views,
                        "parameters_are_free": parameters_are_free,
                        "priced_by_bytes": priced_by_bytes}
        bare = build_network(graph, {}, **self.options)
        self.num_nodes = bare.num_nodes
        self.tails, self.heads = bare.tails, bare.heads
        infinite = np.isinf(bare.capacities)
        self.scaled = np.minimum(_scale(bare.capacities, infinite), INFINITE_CAPACITY)
        self.enabled = not takes_python_flow(int(bare.tails.size))
        self._solved: list[_Solved] = []
        self._rows = np.zeros((0, (len(graph.nodes) + 7) // 8), dtype=np.uint8)
        self._counts: list[int] = []            # bans per solved cut
        self.flows = self.reused = 0

    def cut(self, banned: dict[int, str]) -> CorePartition:
        """What ``partition_banned(graph, banned, solver="scipy", **options)`` answers."""
        if not self.enabled:
            return partition_banned(self.graph, banned, solver="scipy", **self.options)
        n = len(self.graph.nodes)
        mask = np.zeros(n, dtype=bool)
        mask[np.fromiter(banned, dtype=np.int64, count=len(banned))] = True
        network = build_network(self.graph, banned, **self.options)
        sink_side = self._same_effect(mask)
        if sink_side is None:
            packed = np.packbits(mask)
            rows = self._rows[:len(self._solved)]
            if rows.shape[0] and (~(packed & ~rows).any(axis=1)).any():
                sink_side = self._bounded(mask)
            else:  # the whole network, its paths of infinite edges checked first
                infinite = np.isinf(network.capacities)
                if _reachable(self.num_nodes, network.tails[infinite], network.heads[infinite],
                              SOURCE)[SINK]:  # the solver's error, with the path
                    return partition_banned(self.graph, banned, solver="scipy", **self.options)
                sink_side = self._whole(mask)
        source_side = ~sink_side
        crossing = source_side[network.tails] & ~source_side[network.heads]
        value = float(network.capacities[crossing].sum()) if crossing.any() else 0.0
        cut = MinCut(value=value, source_side=source_side)
        edges = cut.cut_edges(network)
        structure = self.graph.structure
        nodes = structure.edge_node[edges[edges < structure.tails.shape[0]]]
        if nodes.size != edges.size or (nodes < 0).any() or math.isinf(value):
            raise AssertionError("cut family: a reused or bounded cut crosses an infinite edge")
        return CorePartition(self.graph, np.sort(nodes), value, banned, network, cut, "scipy")

    # ---- reuse ---------------------------------------------------------------------------

    def _same_effect(self, mask: np.ndarray) -> np.ndarray | None:
        """A solved cut's sink side when ``mask``'s network has the same maximum flow."""
        for solved in reversed(self._solved):
            if solved.ban_flow is None:
                continue
            added = mask & ~solved.banned
            if added.any() and solved.sink_side[2 + 2 * np.flatnonzero(added)].any():
                continue
            lifted = solved.banned & ~mask
            if lifted.any() and (solved.ban_flow[lifted] > 0).any():
                continue
            self.reused += 1
            return solved.sink_side
        return None

    def _whole(self, mask: np.ndarray) -> np.ndarray:
        """The sink side under ``mask`` (feasible) on the whole network; the flow on each ban
        edge is kept for ``_same_effect``."""
        size, tails, heads, caps = self._whole_edges(mask)
        graph = self._matrix(size, tails, heads, caps)
        flow = _sparse().csgraph.maximum_flow(graph, SOURCE, SINK).flow
        sink_side = _residual_reach(size, graph, flow)
        row = flow.tocsr()[SOURCE]
        ban_flow = np.zeros(len(self.graph.nodes), dtype=np.int64)
        ours = (row.indices >= 2) & (row.indices % 2 == 0)
        ban_flow[(row.indices[ours] - 2) // 2] = row.data[ours]
        self._keep(_Solved(mask, np.packbits(mask), sink_side, ban_flow))
        self.flows += 1
        return sink_side

    def _keep(self, solved: _Solved) -> None:
        if len(self._solved) == self._rows.shape[0]:  # grow the packed-mask table
            grown = np.zeros((max(16, 2 * self._rows.shape[0]), solved.packed.size),
                             dtype=np.uint8)
            grown[:len(self._solved)] = self._rows[:len(self._solved)]
            self._rows = grown
        self._rows[len(self._solved)] = solved.packed
        self._counts.append(int(solved.banned.sum()))
        self._solved.append(solved)

    # ---- bounded solves ------------------------------------------------------------------

    def _bounded(self, mask: np.ndarray) -> np.ndarray:
        """The sink side under ``mask`` (feasible), solved between the known bounds."""
        v = self.num_nodes
        fixed_source = np.zeros(v, dtype=bool)
        fixed_sink = np.zeros(v, dtype=bool)
        fixed_source[SOURCE] = True
        fixed_source[2 + 2 * np.flatnonzero(mask)] = True
        fixed_sink[SINK] = True
        packed = np.packbits(mask)
        rows = self._rows[:len(self._solved)]
        subsets = np.flatnonzero(~(rows & ~packed).any(axis=1))
        supersets = np.flatnonzero(~(packed & ~rows).any(axis=1))
        # The closest few on each side (most bans below, fewest above): every one is a valid
        # bound, the closest are the tightest.
        for k in sorted(subsets.tolist(), key=lambda k: -self._counts[k])[:BOUNDS]:
            fixed_source |= ~self._solved[k].sink_side
        for k in sorted(supersets.tolist(), key=lambda k: self._counts[k])[:BOUNDS]:
            fixed_sink |= self._solved[k].sink_side
        if (fixed_source & fixed_sink).any():
            raise AssertionError("cut family: nested cuts disagree")
        free = ~(fixed_source | fixed_sink)
        if not free.any():
            self.reused += 1
            sink_side = fixed_sink
        else:
            sink_side = fixed_sink | self._solve_between(fixed_source, fixed_sink, free)
            self.flows += 1
        self._keep(_Solved(mask, np.packbits(mask), sink_side, None))
        return sink_side

    def _solve_between(self, fixed_source: np.ndarray, fixed_sink: np.ndarray,
                       free: np.ndarray) -> np.ndarray:
        """The free nodes on the sink side: the contracted network's residual reachability."""
        free_ids = np.flatnonzero(free)
        label = np.empty(self.num_nodes, dtype=np.int64)
        label[fixed_source] = SOURCE
        label[fixed_sink] = SINK
        label[free_ids] = 2 + np.arange(free_ids.size, dtype=np.int64)
        tails, heads = label[self.tails], label[self.heads]
        keep = (tails != heads) & (tails != SINK) & (heads != SOURCE) & \
            ~((tails == SOURCE) & (heads == SINK))
        size = 2 + int(free_ids.size)
        flow_sides = self._residual_sink_side(size, tails[keep], heads[keep], self.scaled[keep])
        return np.zeros(self.num_nodes, dtype=bool) if flow_sides is None else \
            _lift(flow_sides, free_ids, self.num_nodes)

    def _whole_edges(self, mask: np.ndarray) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        heads = 2 + 2 * np.flatnonzero(mask)
        return (self.num_nodes,
                np.concatenate([self.tails, np.full(heads.size, SOURCE, dtype=np.int64)]),
                np.concatenate([self.heads, heads]),
                np.concatenate([self.scaled, np.full(heads.size, INFINITE_CAPACITY,
                                                     dtype=np.int64)]))

    @staticmethod
    def _matrix(size: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray) -> object:
        sparse = _sparse()
        graph = sparse.csr_matrix((caps, (tails, heads)), shape=(size, size))
        graph.sum_duplicates()
        graph.data = np.minimum(graph.data, INFINITE_CAPACITY).astype(np.int32)
        return graph

    def _residual_sink_side(self, size: int, tails: np.ndarray, heads: np.ndarray,
                            caps: np.ndarray) -> np.ndarray | None:
        if tails.size == 0:
            return None
        graph = self._matrix(size, tails, heads, caps)
        return _residual_reach(size, graph, _sparse().csgraph.maximum_flow(graph, SOURCE,
                                                                           SINK).flow)


def _residual_reach(size: int, graph: object, flow: object) -> np.ndarray:
    """Every node that can still reach the sink in the residual graph (as the solver)."""
    residual = (graph.astype(np.int64) - flow.astype(np.int64)).tocoo()  # type: ignore[attr-defined]
    open_edges = residual.data > 0
    return _reachable(size, residual.col[open_edges].astype(np.int64),
                      residual.row[open_edges].astype(np.int64), SINK)


def _lift(sides: np.ndarray, free_ids: np.ndarray, num_nodes: int) -> np.ndarray:
    """The contracted network's sink side as the whole network's free nodes."""
    found = np.zeros(num_nodes, dtype=bool)
    found[free_ids] = sides[2:]
    return found
