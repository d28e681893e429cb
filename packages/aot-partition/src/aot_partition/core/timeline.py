"""The memory timeline of one partition on plain data: what is alive at each step.

The step runs the forward in order, then the backward. Forward inputs (categories input,
parameter, seed) are held by the caller for the whole step; tangents arrive when the backward
starts. Every other value is allocated when its node runs (``nbytes`` as given) and freed after
its last use in its phase, except the forward's outputs (forward values no forward node reads:
the caller holds them), the saved values (alive until their last backward use) and the
backward's gradients (``backward`` nodes of the backward). A recomputed node runs in both
phases. The backward runs each recomputed node just before its first user there. The peak is taken after
each allocation, while the node's inputs are still alive.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .graph import INPUT_CATEGORIES, CoreGraph, CorePartition

__all__ = ["CoreMemoryTimeline", "decision_kinds", "simulate_memory"]


@dataclass(frozen=True)
class CoreMemoryTimeline:
    """Live bytes after each node runs: ``steps`` holds (phase, node id, live bytes)."""

    peak_bytes: int
    peak_at: str                      # "forward <id>", "backward <id>" or "start"
    baseline_bytes: int               # forward inputs, alive before the step
    steps: tuple[tuple[str, str, int], ...]


def _reaches_sink(result: CorePartition) -> np.ndarray:
    """Per node, whether its input half reaches the sink over uncut edges: what the backward
    computes (one breadth-first search on the reversed network, in scipy)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    network = result.network
    kept = np.ones(network.num_edges, dtype=bool)
    kept[result.cut.cut_edges(network)] = False
    n = network.num_nodes
    reversed_kept = csr_matrix((np.ones(int(kept.sum()), dtype=np.int8),
                                (network.heads[kept], network.tails[kept])), shape=(n, n))
    reaches = np.zeros(n, dtype=bool)
    reaches[breadth_first_order(reversed_kept, network.sink, directed=True,
                                return_predecessors=False)] = True
    return reaches[2 + 2 * np.arange(len(result.graph.nodes))]


def recomputed_mask(result: CorePartition) -> np.ndarray:
    """Per node, whether ``decision_kinds`` calls it "recomputed" (a forward node the backward
    reaches through the cut, not saved, not in the backward), as one boolean array."""
    graph = result.graph
    nodes = graph.nodes
    forward = graph._cache.get("forward mask")
    if forward is None:  # per graph: a budget search asks for every candidate cut
        forward = graph._cache["forward mask"] = np.fromiter(
            (n.forward and not n.in_backward for n in nodes), dtype=bool, count=len(nodes))
    saved = np.zeros(len(nodes), dtype=bool)
    saved[result.saved_indices] = True
    return forward & ~saved & _reaches_sink(result)


def decision_kinds(result: CorePartition) -> list[str]:
    """Per node, its decision's kind (saved, recomputed, backward, forward) as
    ``result.decisions`` has it, without building every decision and its reason."""
    reaches = _reaches_sink(result).tolist()
    saved = set(result.saved_indices.tolist())
    kinds = []
    for i, node in enumerate(result.graph.nodes):
        if node.in_backward:
            kinds.append("backward")
        elif i in saved:
            kinds.append("saved")
        elif reaches[i]:
            kinds.append("recomputed" if node.forward else "backward")
        else:
            kinds.append("forward")
    return kinds


def _topological(graph: CoreGraph) -> list[int]:
    """Node positions in graph order when that order is topological, else a Kahn order that
    keeps graph order among ready nodes."""
    inputs = graph.input_indices
    if all(j < i for i, reads in enumerate(inputs) for j in reads):
        return list(range(len(graph.nodes)))
    pending = [len(reads) for reads in inputs]
    ready = [i for i, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in graph.users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return order


def _on_demand(graph: CoreGraph, order: list[int], kinds: list[str]) -> list[int]:
    """The backward's order: its nodes in ``order``, each recomputed node just before its
    first backward user needs it (as a compiler schedules a recompute, not all up front)."""
    ran: set[int] = set()
    found: list[int] = []
    for root in order:
        if kinds[root] != "backward" or graph.nodes[root].category == "tangent":
            continue
        stack = [(root, iter(graph.input_indices[root]))]
        while stack:
            i, pending = stack[-1]
            j = next(pending, None)
            if j is None:
                stack.pop()
                ran.add(i)
                found.append(i)
            elif kinds[j] == "recomputed" and j not in ran:
                ran.add(j)  # on the stack: the graph is acyclic, so it is reached only once
                stack.append((j, iter(graph.input_indices[j])))
    return found


def simulate_memory(result: CorePartition) -> CoreMemoryTimeline:
    """The timeline of ``result``'s forward then backward (see the module doc)."""
    graph = result.graph
    nodes = graph.nodes
    nbytes = [int(n.nbytes) for n in nodes]
    kinds = decision_kinds(result)
    saved = set(result.saved_indices.tolist())
    held = {i for i, n in enumerate(nodes) if n.category in INPUT_CATEGORIES
            and n.category != "tangent"}
    order = _topological(graph)
    forward = [i for i in order if i not in held and nodes[i].category != "tangent"
               and (i in saved or (kinds[i] in ("recomputed", "forward") and nodes[i].forward))]
    backward = _on_demand(graph, order, kinds)
    tangents = [i for i, n in enumerate(nodes) if n.category == "tangent"]

    live = sum(nbytes[i] for i in held)
    baseline = live
    peak, peak_at = live, "start"
    steps: list[tuple[str, str, int]] = []

    def run(phase: str, ran: list[int], keep: set[int]) -> None:
        nonlocal live, peak, peak_at
        last_use: dict[int, int] = {}
        for step, i in enumerate(ran):
            for j in graph.input_indices[i]:
                last_use[j] = step
        alive = set()
        for step, i in enumerate(ran):
            live += nbytes[i]
            alive.add(i)
            steps.append((phase, nodes[i].id, live))
            if live > peak:
                peak, peak_at = live, f"{phase} {nodes[i].id}"
            for j in graph.input_indices[i]:
                if last_use[j] == step and j not in keep and (j in alive or j in phase_inputs):
                    live -= nbytes[j]
                    alive.discard(j)
                    phase_inputs.discard(j)
            if i not in last_use and i not in keep:  # read by nothing in this phase
                live -= nbytes[i]
                alive.discard(i)

    # Forward: saved values and the forward's outputs stay; the rest goes after its last use.
    read_in_forward = {j for i in forward for j in graph.input_indices[i]}
    outputs = {i for i in forward if i not in read_in_forward}
    phase_inputs: set[int] = set()
    run("forward", forward, held | saved | outputs)
    # Backward: tangents arrive; saved values are inputs of this phase, freed after their
    # last use (at once when the backward reads them not at all).
    live += sum(nbytes[i] for i in tangents)
    read_in_backward = {j for i in backward for j in graph.input_indices[i]}
    unread = [i for i in saved if i not in held and i not in outputs and i not in read_in_backward]
    live -= sum(nbytes[i] for i in unread)
    phase_inputs = {i for i in saved if i not in held and i not in outputs} - set(unread)
    phase_inputs |= set(tangents)
    gradients = {i for i in backward if nodes[i].backward}
    run("backward", backward, held | outputs | gradients)
    return CoreMemoryTimeline(int(peak), peak_at, int(baseline), tuple(steps))
