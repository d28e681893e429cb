"""torch's ban rules on plain data: named, opt-in reasons why a node may not be recomputed.

torch's partitioner refuses to recompute some forward nodes (a matmul, a value the backward
materializes anyway, ...). Each heuristic is a rule here, under the name the fx policy uses
(``fx.policy.active_rule_names``), reading only what a ``CoreNode`` says: its category, op
label, bytes, users, forward/output flags, fusibility and allowlist membership, and the hops to
the backward. ``partition(graph, rules=(...))`` turns rules on per call; the first rule in
``RULES`` order that fires gives a node's reason (after the node's own ban, the call's bans and
the category bans). Per-node rules skip inputs, nodes the front end marks ``trivial``, nodes
that cannot be banned (views, checkpoint recomputes, backward nodes) and released ones; the
graph-wide rules see every ban made before them.

Also the graph facts the rules and the save costs share: fusibility, materialization, the
hops from each forward node to the backward. No import of ``graph`` (it imports this); the
graph is read through ``RuleGraph``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "COLLECTIVE_REASON",
    "FUSIBLE",
    "LONG_CHAIN",
    "RULES",
    "TORCH_DEFAULT_RULES",
    "BanRule",
    "distances_from_backward",
    "rule_bans",
]

FUSIBLE = frozenset({"view", "pointwise", "reduction", "random", "symbolic"})
INPUT_CATEGORIES = frozenset({"input", "parameter", "seed", "tangent"})
# Categories torch's allowlist of recomputable ops covers, when a node does not say.
RECOMPUTABLE = frozenset({"view", "pointwise", "reduction", "symbolic"})
FAR = int(1e9)          # distance of nodes that never reach the backward
LONG_CHAIN = 100        # a chain of fusible forward ops longer than this gets cut (torch's)
COLLECTIVE_REASON = ("collective: recomputing it repeats network traffic and can deadlock if "
                     "ranks disagree")
EFFECTFUL_REASON = "effectful op: recomputing would repeat its side effect"
RANDOM_REASON = "random op: recomputing costs a second draw and a saved RNG state"


class RuleGraph(Protocol):
    """What the rules read of a ``core.graph.CoreGraph``."""

    @property
    def nodes(self) -> tuple[Any, ...]: ...
    @property
    def users(self) -> list[list[int]]: ...
    @property
    def input_indices(self) -> list[list[int]]: ...
    @property
    def _cache(self) -> dict[Any, Any]: ...


# ---- graph facts -------------------------------------------------------------------------

def _cached(graph: RuleGraph, key: Any, make: Callable[[], Any]) -> Any:
    found = graph._cache.get(key)
    if found is None:
        found = graph._cache[key] = make()
    return found


def fusion(graph: RuleGraph) -> tuple[list[bool], list[bool]]:
    """Per node, (whether its op fuses with its neighbours: ``CoreNode.fusible``, else by
    category; whether it is a concatenation, which fuses whatever it reads)."""
    return _cached(graph, "fusion", lambda: (
        [n.fusible if n.fusible is not None else n.category in FUSIBLE for n in graph.nodes],
        [n.category == "concat" for n in graph.nodes]))


def fuses(graph: RuleGraph, producer: int, consumer: int) -> bool:
    """Whether ``consumer`` reads ``producer`` without materializing it: both fuse, or the
    consumer is a concatenation (it can take its inputs written in place)."""
    fusible, concat = fusion(graph)
    return concat[consumer] or (fusible[producer] and fusible[consumer])


def use_edges(graph: RuleGraph) -> tuple[np.ndarray, np.ndarray]:
    """(producers, consumers): one entry per use, the position read and the position reading
    it (each pair once, consumers in node order), as int64 arrays."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        inputs = graph.input_indices
        counts = np.fromiter(map(len, inputs), dtype=np.int64, count=len(inputs))
        producers = np.fromiter(itertools.chain.from_iterable(inputs), dtype=np.int64,
                                count=int(counts.sum()))
        return producers, np.repeat(np.arange(len(inputs), dtype=np.int64), counts)
    return _cached(graph, "use edges", make)


def materialized(graph: RuleGraph) -> np.ndarray:
    """Per node (bool), whether its value exists in memory anyway: an input, a graph output,
    or a use that cannot fuse it (``fuses``)."""
    def make() -> np.ndarray:
        fusible, concat = (np.array(facts, dtype=bool) for facts in fusion(graph))
        producers, consumers = use_edges(graph)
        unfused = ~(concat[consumers] | (fusible[producers] & fusible[consumers]))
        found = np.array([n.category in INPUT_CATEGORIES or n.output for n in graph.nodes],
                         dtype=bool)
        found[producers[unfused]] = True
        return found
    return _cached(graph, "materialized", make)


def distances_from_backward(graph: RuleGraph) -> np.ndarray:
    """Hops from each forward node to its nearest user outside the forward (0 outside it);
    forward nodes that never reach the backward get a large distance."""
    def make() -> np.ndarray:
        nodes, users = graph.nodes, graph.users
        dist = np.zeros(len(nodes), dtype=np.int64)
        for i in _reverse_topological(graph):
            if nodes[i].forward:
                dist[i] = min((dist[u] + 1 for u in users[i]), default=FAR)
        return np.minimum(dist, FAR)
    return _cached(graph, "distances", make)


def use_distances(graph: RuleGraph, distances: np.ndarray) -> None:
    """Hand ``graph`` a front end's hops to the backward, already computed by the same
    definition (``distances_from_backward``), so the core does not count them again."""
    if len(distances) != len(graph.nodes):
        raise ValueError(f"distances has {len(distances)} entries for {len(graph.nodes)} nodes")
    graph._cache["distances"] = np.minimum(np.asarray(distances, dtype=np.int64), FAR)


def _reverse_topological(graph: RuleGraph) -> list[int]:
    """Node positions, every node after all of its users."""
    pending = [len(u) for u in graph.users]
    order = [i for i, count in enumerate(pending) if count == 0]
    inputs = graph.input_indices
    for i in order:  # grows while iterated: a Kahn queue over "read by"
        for j in inputs[i]:
            pending[j] -= 1
            if pending[j] == 0:
                order.append(j)
    return order


def _forward_ranks(graph: RuleGraph) -> tuple[list[int], dict[int, int]]:
    """(forward positions in order, position -> rank among the forward nodes)."""
    def make() -> tuple[list[int], dict[int, int]]:
        forward = [i for i, n in enumerate(graph.nodes) if n.forward]
        return forward, {i: r for r, i in enumerate(forward)}
    return _cached(graph, "forward_ranks", make)


def _label(node: Any) -> str:
    return node.op or node.category


# ---- per-node rules: (graph, position, max_dist_from_bw) -> reason or None ------------------

def never_recomputable(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    """An op with a side effect (category ``effectful``), even where ``allow_recompute``."""
    return EFFECTFUL_REASON if graph.nodes[i].category == "effectful" else None


def collective(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    return COLLECTIVE_REASON if graph.nodes[i].category == "collective" else None


def not_in_allowlist(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    node = graph.nodes[i]
    allowed = (node.recomputable if node.recomputable is not None
               else node.category in RECOMPUTABLE)
    return None if allowed else f"not in allowlist: {_label(node)} is not a recomputable op"


def random_op(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    return RANDOM_REASON if graph.nodes[i].category == "random" else None


def compute_intensive(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    node = graph.nodes[i]
    return f"compute-intensive op: {_label(node)}" if node.category == "compute" else None


def materialized_in_backward(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    """A user outside the forward that cannot fuse it (through views), or a graph output."""
    nodes, users = graph.nodes, graph.users
    if nodes[i].category == "view":
        return None
    pending, seen = [i], {i}
    while pending:
        cur = pending.pop()
        for user in users[cur]:
            if not nodes[user].forward and not fuses(graph, cur, user):
                return f"materialized in backward: used unfused by {nodes[user].id}"
            if nodes[user].category == "view" and user not in seen:
                seen.add(user)
                pending.append(user)
        if nodes[cur].output:  # the output reads it after every node does
            return "materialized in backward: used unfused by output"
    return None


def too_far_from_backward(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    """More than ``max_dist_from_bw`` hops from the backward (nodes that never reach it are
    exempt: nothing would recompute them)."""
    dist = int(distances_from_backward(graph)[i])
    if max_dist < dist < FAR:
        return f"too far from backward: {dist} ops > max_dist_from_bw={max_dist}"
    return None


def reduction(graph: RuleGraph, i: int, max_dist: int) -> str | None:
    """Output 4x smaller than its inputs: saving it is cheap, recomputing it (a norm) is not."""
    nodes = graph.nodes
    input_bytes = sum(nodes[j].nbytes for j in graph.input_indices[i])
    output_bytes = nodes[i].nbytes
    if output_bytes * 4 < input_bytes:
        return f"reduction: output {input_bytes / max(output_bytes, 1):.0f}x smaller than inputs"
    return None


# ---- graph-wide rules: they read (and extend) the bans made so far --------------------------

def _first_unfusible_use(graph: RuleGraph, start: list[int], max_rank: int) -> int:
    nodes, users = graph.nodes, graph.users
    _, rank = _forward_ranks(graph)
    fusible, concat = fusion(graph)
    heap = [(rank[i], True, i) for i in start]
    heapq.heapify(heap)
    pushed = {(i, True) for i in start}
    while heap:
        order, is_fusible, i = heapq.heappop(heap)
        if not is_fusible:
            return order
        for user in users[i]:
            if nodes[user].forward and rank[user] <= max_rank:
                entry = (user, concat[user] or (fusible[i] and fusible[user]))
                if entry not in pushed:
                    pushed.add(entry)
                    heapq.heappush(heap, (rank[user], entry[1], user))
    return max_rank


def ban_used_far_apart(graph: RuleGraph, banned: dict[int, str], eligible: np.ndarray) -> None:
    """Fusible users of a value that come after an unfusible use of it: recomputing both a near
    and a far user of one value rarely fuses, so the far one is saved."""
    nodes, users = graph.nodes, graph.users
    forward, rank = _forward_ranks(graph)
    fusible, concat = fusion(graph)
    for used in forward:
        fw_users = [u for u in users[used] if nodes[u].forward]
        if len(fw_users) < 2:
            # A lone user is its value's first use: the search from it only reaches later
            # ranks, past max_rank, so nothing comes after an unfusible use.
            continue
        first_unfusible = _first_unfusible_use(graph, fw_users, max(rank[u] for u in fw_users))
        for user in fw_users:
            if (rank[user] > first_unfusible and (concat[user] or fusible[used] and fusible[user])
                    and user not in banned and eligible[user]):
                banned[user] = (f"used far apart: {nodes[used].id} is used before and after "
                                "an unfusible op")


def ban_long_fusible_chains(graph: RuleGraph, banned: dict[int, str],
                            eligible: np.ndarray) -> None:
    """Cut chains of fusible forward ops longer than ``LONG_CHAIN`` (e.g. residual streams)."""
    nodes, users = graph.nodes, graph.users
    forward, rank = _forward_ranks(graph)
    fusible, concat = fusion(graph)
    visited: set[int] = set()
    for start in forward:
        start_rank = rank[start]
        heap = [(start_rank, start)]
        while heap:
            order, cur = heapq.heappop(heap)
            if cur in visited:
                continue
            visited.add(cur)
            if order > start_rank + LONG_CHAIN and not heap:
                if eligible[cur]:
                    banned.setdefault(cur, f"long fusible chain: {order - start_rank} fusible "
                                           f"ops from {nodes[start].id}")
                break
            for user in users[cur]:
                if (nodes[user].forward and (concat[user] or fusible[cur] and fusible[user])
                        and user not in banned):
                    heapq.heappush(heap, (rank[user], user))


# ---- the rule table ----------------------------------------------------------------------

NodeCheck = Callable[[RuleGraph, int, int], "str | None"]
GraphSweep = Callable[[RuleGraph, dict[int, str], np.ndarray], None]


@dataclass(frozen=True)
class BanRule:
    """One named rule: a per-node ``check`` or a graph-wide ``sweep``."""

    name: str
    check: NodeCheck | None = None
    sweep: GraphSweep | None = None


# In the order reasons are consulted (torch's): per-node rules, then the graph-wide ones.
RULES: dict[str, BanRule] = {r.name: r for r in (
    BanRule("never_recomputable", check=never_recomputable),
    BanRule("collective", check=collective),
    BanRule("not_in_allowlist", check=not_in_allowlist),
    BanRule("random_op", check=random_op),
    BanRule("compute_intensive", check=compute_intensive),
    BanRule("materialized_in_backward", check=materialized_in_backward),
    BanRule("too_far_from_backward", check=too_far_from_backward),
    BanRule("reduction", check=reduction),
    BanRule("ban_used_far_apart", sweep=ban_used_far_apart),
    BanRule("ban_long_fusible_chains", sweep=ban_long_fusible_chains),
)}
# The rules torch's min-cut partitioner turns on by default (its allowlist stands for
# random_op and compute_intensive, which its aggressive mode uses instead).
TORCH_DEFAULT_RULES = ("never_recomputable", "collective", "not_in_allowlist",
                       "materialized_in_backward", "too_far_from_backward", "reduction",
                       "ban_used_far_apart", "ban_long_fusible_chains")
MAX_DIST_FROM_BW = 1000   # torch's default for too_far_from_backward


class RuleError(ValueError):
    """A call names an unknown rule (the message lists the valid names)."""


def rule_names(rules: object) -> tuple[str, ...]:
    """``rules`` checked and put in ``RULES`` order (the order reasons are consulted in)."""
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Iterable):
        raise RuleError(f"rules must be a collection of rule names, got {rules!r}; e.g. "
                        f"({rules!r},) for one rule")
    given = list(rules)
    unknown = [r for r in given if r not in RULES]
    if unknown:
        raise RuleError(f"unknown ban rule {unknown[0]!r}; valid rules: {', '.join(RULES)}")
    return tuple(name for name in RULES if name in given)


def apply_rules(graph: RuleGraph, names: tuple[str, ...], found: Mapping[int, str],
                eligible: np.ndarray, max_dist: int) -> dict[int, str]:
    """``found`` (position -> reason, node order) with the rules' bans added: the per-node
    rules' in node order, then the graph-wide rules' in the order made. ``eligible``: the
    nodes a ban may apply to (bannable and not released)."""
    checks = [RULES[n].check for n in names if RULES[n].check is not None]
    sweeps = [RULES[n].sweep for n in names if RULES[n].sweep is not None]
    banned = dict(found)
    if checks:
        hits = _cached(graph, ("rule hits", names, max_dist),
                       lambda: _node_rule_hits(graph, checks, max_dist))
        added = {i: why for i, why in hits.items() if eligible[i] and i not in banned}
        if added:
            banned = dict(sorted({**added, **banned}.items()))
    for sweep in sweeps:
        assert sweep is not None
        sweep(graph, banned, eligible)
    return banned


def _node_rule_hits(graph: RuleGraph, checks: list[NodeCheck | None],
                    max_dist: int) -> dict[int, str]:
    """Position -> the first per-node rule's reason, over the nodes the rules may ban (before
    release and the other bans; cached per rule set)."""
    hits: dict[int, str] = {}
    for i, node in enumerate(graph.nodes):
        if (not node.forward or node.trivial or node.must_recompute or node.in_backward
                or node.category == "view" or node.category in INPUT_CATEGORIES):
            continue
        for check in checks:
            assert check is not None
            reason = check(graph, i, max_dist)
            if reason is not None:
                hits[i] = reason
                break
    return hits


def rule_bans(graph: RuleGraph, name: str, *,
              max_dist_from_bw: int = MAX_DIST_FROM_BW) -> dict[str, str]:
    """Node id -> reason of the one rule ``name`` alone on ``graph`` (nothing released; a
    graph-wide rule sees no earlier bans): to see what a rule would do."""
    (name,) = rule_names((name,))
    eligible = np.array([not (n.must_recompute or n.in_backward or n.category == "view")
                         for n in graph.nodes], dtype=bool)
    found = apply_rules(graph, (name,), {}, eligible, max_dist_from_bw)
    return {graph.nodes[i].id: why for i, why in found.items()}
