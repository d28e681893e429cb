"""The min-cut contract: a flow network as arrays, a cut, and a registry of solvers.

A solver is any ``Callable[[FlowNetwork], MinCut]``. networkx is the reference solver; the
scipy one lives in ``mincut_scipy.py`` and is imported only when asked for.
"""

from __future__ import annotations

import importlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FlowNetwork:
    """A directed network; edge ``e`` goes ``tails[e] -> heads[e]`` with ``capacities[e]``."""

    num_nodes: int
    source: int
    sink: int
    tails: np.ndarray        # int64 [E]
    heads: np.ndarray        # int64 [E]
    capacities: np.ndarray   # float64 [E], math.inf for infinite edges
    names: list[str]         # names[i] for node index i (for errors and debugging)

    @property
    def num_edges(self) -> int:
        return int(self.tails.shape[0])


@dataclass(frozen=True)
class MinCut:
    value: float              # total capacity of cut edges (inf if infeasible)
    source_side: np.ndarray   # bool [num_nodes], True = cannot reach the sink in the residual graph

    def cut_edges(self, network: FlowNetwork) -> np.ndarray:
        """Indices of edges from the source side to the sink side."""
        side = self.source_side
        return np.flatnonzero(side[network.tails] & ~side[network.heads])


MinCutSolver = Callable[[FlowNetwork], MinCut]


def networkx_min_cut(network: FlowNetwork) -> MinCut:
    """The reference solver (networkx preflow-push), same edge order as torch builds.

    Its source side is every node that cannot reach the sink in the residual graph (the
    largest minimum-cut source side, as networkx and hence torch report it); any solver's
    minimum cut has the same value.
    """
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(range(network.num_nodes))
    for tail, head, cap in zip(network.tails.tolist(), network.heads.tolist(),
                               network.capacities.tolist()):
        if graph.has_edge(tail, head):  # parallel edges add up
            graph[tail][head]["capacity"] += cap
        else:
            graph.add_edge(tail, head, capacity=cap)
    try:
        value, (reachable, _) = nx.minimum_cut(graph, network.source, network.sink)
    except nx.NetworkXUnbounded:
        side = np.zeros(network.num_nodes, dtype=bool)
        side[network.source] = True
        return MinCut(math.inf, side)
    side = np.zeros(network.num_nodes, dtype=bool)
    side[list(reachable)] = True
    return MinCut(float(value), side)


SOLVERS: dict[str, MinCutSolver] = {"networkx": networkx_min_cut}

# Solvers that live in optional modules: name -> (module, attribute), imported on first use.
LAZY_SOLVERS: dict[str, tuple[str, str]] = {
    "scipy": ("aot_partition.core.mincut_scipy", "scipy_min_cut"),
}


def available_solver_names() -> list[str]:
    return sorted(set(SOLVERS) | set(LAZY_SOLVERS))


def get_solver(name: str) -> MinCutSolver:
    """The solver registered as ``name``; unknown names raise ValueError listing valid ones."""
    if name in SOLVERS:
        return SOLVERS[name]
    if name in LAZY_SOLVERS:
        module_name, attr = LAZY_SOLVERS[name]
        solver = getattr(importlib.import_module(module_name), attr)
        SOLVERS[name] = solver
        return solver
    raise ValueError(
        f"unknown min-cut solver {name!r}; valid solvers: {', '.join(available_solver_names())}"
    )


def infinite_path(network: FlowNetwork) -> list[int] | None:
    """Edge indices of a source-to-sink path using only infinite edges (BFS), else None.

    Such a path makes every cut infinite: the partition is infeasible.
    """
    infinite = np.isinf(network.capacities)
    out_edges: dict[int, list[int]] = {}
    for e in np.flatnonzero(infinite).tolist():
        out_edges.setdefault(int(network.tails[e]), []).append(e)
    came_by: dict[int, int] = {network.source: -1}
    queue = deque([network.source])
    while queue:
        node = queue.popleft()
        for e in out_edges.get(node, ()):
            head = int(network.heads[e])
            if head in came_by:
                continue
            came_by[head] = e
            if head == network.sink:
                path = []
                while head != network.source:
                    path.append(came_by[head])
                    head = int(network.tails[came_by[head]])
                return path[::-1]
            queue.append(head)
    return None
