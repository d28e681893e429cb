"""A graph-agnostic min-cut partitioner: a joint graph described in plain data, no torch.fx.

A front end (the fx adapter in ``network.py``, or any other compiler) describes each node of
its joint forward/backward graph as a ``CoreNode``: an id, the ids it reads, its output bytes,
a category and where it is needed. ``partition`` builds the min-cut flow network from that
description and solves it with ``mincut.py``'s solvers; it returns the saved set, the cut's
cost and, per node, a decision with a reason.

The network (torch's construction): every node ``n`` becomes ``n_in`` and ``n_out``; the edge
``n_in -> n_out`` costs what saving ``n`` costs, and cutting it means "save n". Infinite edges
encode what cannot be cut: data dependencies (``n_out -> user_in``), bans on recomputation
(``source -> n_in``) and backward needs (``-> sink``).

Rules the core owns (the category-level ones; a front end adds its own heuristics as ban
reasons, per node in the description or per call in ``partition(bans=...)``, and turns on
torch's named ban rules per call, ``partition(rules=...)``, see ``rules.py``):

- ``input``/``parameter`` forward nodes are banned ("primal input"), ``seed`` ones too
  ("forward RNG seed"); ``effectful`` and ``random`` forward nodes are banned unless the node
  says ``allow_recompute`` (a front end that replays RNG state, say). A front-end reason wins
  over the category's.
- ``view`` nodes and ``must_recompute`` nodes are never banned; ``release`` lifts every ban
  of the nodes it names.
- The save cost is ``save_cost`` when given; otherwise infinite for ``opaque`` values and for
  views under ``recompute_views``, 0 for parameters under ``parameters_are_free``, the bytes
  for ``symbolic`` scalars, and else the bytes biased towards nodes near the backward
  (x1.1 per hop, 1 to 100 hops) and doubled when the value would otherwise never exist in
  memory (not an input nor an ``output``, and every user fuses it: both are ``fusible``, by
  default the categories view, pointwise, reduction, random, symbolic, or the user is a
  ``concat``).

The graph is validated once when a ``CoreGraph`` is built; its network structure is cached on
it, so repeated ``partition`` calls (a memory-budget search) only redo the bans and capacities.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import InfeasibleMinCutError
from .mincut import FlowNetwork, MinCut, get_solver, infinite_path
from .rules import (
    EFFECTFUL_REASON,
    INPUT_CATEGORIES,
    MAX_DIST_FROM_BW,
    RANDOM_REASON,
    RuleError,
    apply_rules,
    distances_from_backward,
    materialized,
    rule_names,
)

log = logging.getLogger(__name__)

__all__ = [
    "CATEGORIES",
    "CoreDecision",
    "CoreGraph",
    "CoreGraphError",
    "CoreNode",
    "CorePartition",
    "ban_reasons",
    "partition",
]

# Every valid CoreNode.category, with what it means.
CATEGORIES: dict[str, str] = {
    "input": "a forward input (banned from recomputation)",
    "parameter": "a forward input that lives for the whole program (free to save)",
    "seed": "the forward's RNG seed or offset (banned from recomputation)",
    "tangent": "an input of the backward (a gradient, the backward's RNG seed)",
    "view": "a view of another value (never banned; infinite save cost under recompute_views)",
    "pointwise": "an elementwise op (fusible)",
    "reduction": "a reduction (fusible)",
    "compute": "a compute-intensive op (matmul, convolution, attention)",
    "concat": "a concatenation (its inputs fuse into it: they can be written in place)",
    "collective": "a collective communication op or its wait (the collective rule bans it)",
    "random": "an op that draws random numbers (banned unless allow_recompute)",
    "effectful": "an op with a side effect (banned unless allow_recompute)",
    "symbolic": "a symbolic scalar (a size); saving costs its bytes",
    "opaque": "a value that is not a tensor (cannot be saved)",
    "other": "any other op",
}
# Category -> the ban a forward node of it gets when the front end gives no reason.
CATEGORY_BANS: dict[str, str] = {
    "input": "primal input",
    "parameter": "primal input",
    "seed": "forward RNG seed",
    "effectful": EFFECTFUL_REASON,
    "random": RANDOM_REASON,
}
SOLVER_DEFAULT = "scipy"

SOURCE, SINK = 0, 1
# Edge kinds, for reading a reason back (reasons are formatted only for error messages).
SAVE, USES, TO_SINK_COMPUTE, TO_SINK_AVAILABLE, TO_SINK_RECOMPUTE, BAN = range(6)
_DISTANCE_CAP = 100     # hops beyond which the save-cost bias stops growing
# 1.1 ** hops for hops 0.._DISTANCE_CAP, each Python's own power (a vectorized power may round
# differently in the last bit, and a save cost must not depend on how it was computed).
_DISTANCE_GROWTH = np.array([1.1 ** hops for hops in range(_DISTANCE_CAP + 1)])

# Decision kinds.
SAVED, RECOMPUTED, BACKWARD, FORWARD = "saved", "recomputed", "backward", "forward"


# A node's output size at most: 2**63 - 1 bytes, the largest size torch can describe.
MAX_NBYTES = 2**63 - 1


class CoreGraphError(ValueError):
    """A CoreGraph description is invalid; the message names the node and what is valid."""


@dataclass(frozen=True)
class CoreNode:
    """One node of a joint graph, in plain data.

    ``forward``: it exists in the forward: a forward input (even one only the backward reads),
    or a value computed there (from the forward inputs, reaching a forward output). ``backward``: its value must be available in the backward (a gradient).
    ``in_backward``: it is part of the backward (depends on a tangent) and is computed there.
    ``ban``: the front end's reason why it may not be recomputed. ``must_recompute``: a
    checkpoint annotation; it is recomputed in the backward whatever it costs.
    ``save_cost``: overrides the category's save cost (``math.inf``: cannot be saved).
    ``runtime``: an estimate of its cost to compute (reported as recompute time).
    ``saveable``: False when its value is not a tensor (a tuple of outputs, None): it cannot
    be saved whatever its category (category ``opaque`` implies it).

    Facts the ban rules read (``rules.py``; each defaults to what the category says):
    ``op``: the op's name, named in reasons. ``fusible``: the op fuses with its neighbours
    (default: the category is fusible). ``recomputable``: the op is in the allowlist of
    recomputable ops (default: view, pointwise, reduction, symbolic). ``output``: the graph
    returns it (its value exists in memory). ``trivial``: computing it is no work (a tuple
    projection, a constant); the per-node rules skip it.
    """

    id: str
    inputs: tuple[str, ...] = ()
    nbytes: int = 0
    category: str = "other"
    forward: bool = False
    backward: bool = False
    in_backward: bool = False
    runtime: float = 0.0
    ban: str | None = None
    allow_recompute: bool = False
    must_recompute: bool = False
    save_cost: float | None = None
    saveable: bool = True
    op: str = ""
    fusible: bool | None = None
    recomputable: bool | None = None
    output: bool = False
    trivial: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise CoreGraphError(f"node id must be a non-empty string; got {self.id!r}")
        object.__setattr__(self, "inputs", _input_ids(self.id, self.inputs))
        if not isinstance(self.category, str) or self.category not in CATEGORIES:
            raise CoreGraphError(f"node '{self.id}' has unknown category {self.category!r}; "
                                 f"valid categories: {', '.join(CATEGORIES)}")
        if not _is_int(self.nbytes) or not 0 <= self.nbytes <= MAX_NBYTES:
            raise CoreGraphError(f"node '{self.id}' has nbytes {self.nbytes!r}; must be an int "
                                 f"from 0 to {MAX_NBYTES} (the bytes of its output)")
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise CoreGraphError(f"node '{self.id}' has {name} {getattr(self, name)!r}; "
                                     "must be True or False")
        if not _is_number(self.runtime) or not 0 <= self.runtime < math.inf:
            raise CoreGraphError(f"node '{self.id}' has runtime {self.runtime!r}; must be a "
                                 "finite number >= 0")
        if self.ban is not None and (not isinstance(self.ban, str) or not self.ban):
            raise CoreGraphError(f"node '{self.id}' has ban {self.ban!r}; must be a non-empty "
                                 "string (the reason) or None")
        if self.save_cost is not None and (not _is_number(self.save_cost)
                                           or not self.save_cost >= 0):
            raise CoreGraphError(f"node '{self.id}' has save_cost {self.save_cost!r}; must be "
                                 ">= 0 (math.inf: cannot be saved) or None")
        if self.category in INPUT_CATEGORIES and (self.allow_recompute or self.must_recompute):
            flag = "allow_recompute" if self.allow_recompute else "must_recompute"
            raise CoreGraphError(f"node '{self.id}' is an input (category '{self.category}') "
                                 f"with {flag}=True; an input is never recomputed: drop {flag}")
        if self.category == "tangent" and (not self.in_backward or self.forward):
            raise CoreGraphError(f"node '{self.id}' is a tangent (an input of the backward) "
                                 f"but forward={self.forward}, in_backward={self.in_backward}; "
                                 "a tangent has in_backward=True and forward=False")
        self._check_rule_facts()

    def _check_rule_facts(self) -> None:
        if not isinstance(self.op, str):
            raise CoreGraphError(f"node '{self.id}' has op {self.op!r}; must be a string (the "
                                 "op's name, for reasons)")
        for name in ("fusible", "recomputable"):
            if getattr(self, name) not in (None, True, False):
                raise CoreGraphError(f"node '{self.id}' has {name} {getattr(self, name)!r}; "
                                     "must be True, False or None (by category)")

    @classmethod
    def unchecked(cls, **fields: Any) -> CoreNode:
        """A node built without ``__init__``'s checks, for a front end whose values are valid
        by construction (the fx adapter builds one per joint-graph node, thousands per
        partition). ``fields`` must name every field ``_UNCHECKED_DEFAULTS`` does not;
        ``inputs`` must be a tuple. A ``CoreGraph`` still checks ids, inputs and cycles."""
        return cls.unchecked_from({**_UNCHECKED_DEFAULTS, **fields})

    @classmethod
    def unchecked_from(cls, fields: dict[str, Any]) -> CoreNode:
        """``unchecked`` from a dict naming every field, which becomes the node's own (the
        caller hands it over): no keyword packing, no copy."""
        node = object.__new__(cls)
        object.__setattr__(node, "__dict__", fields)  # frozen: no __setattr__
        return node


_UNCHECKED_DEFAULTS: dict[str, Any] = {"runtime": 0.0, "ban": None, "op": "", "fusible": None,
                                       "recomputable": None, "output": False, "trivial": False,
                                       "saveable": True}
_BOOL_FIELDS = ("forward", "backward", "in_backward", "allow_recompute", "must_recompute",
                "output", "trivial", "saveable")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, (bool, np.bool_)))


def _input_ids(node_id: str, inputs: object) -> tuple[str, ...]:
    """``inputs`` as a tuple of ids; a lone string is refused (it would split into letters)."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise CoreGraphError(f"node '{node_id}' has inputs {inputs!r}; must be a tuple of node "
                             f"ids, e.g. ({inputs!r},) for one input")
    ids = tuple(inputs)
    bad = [i for i in ids if not isinstance(i, str)]
    if bad:
        raise CoreGraphError(f"node '{node_id}' has input {bad[0]!r}; inputs must be node ids "
                             "(strings)")
    return ids


def _id_collection(what: str, ids: object) -> list[str]:
    """A call's ``release`` as a list of ids; a lone string is refused like ``inputs``."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise CoreGraphError(f"{what} must be a collection of node ids, got {ids!r}; e.g. "
                             f"({ids!r},) for one node")
    listed = list(ids)
    bad = [i for i in listed if not isinstance(i, str)]
    if bad:
        raise CoreGraphError(f"{what} names {bad[0]!r}; node ids are strings")
    return listed


@dataclass(frozen=True)
class CoreDecision:
    """What happened to one node: ``kind`` is saved, recomputed, backward or forward."""

    id: str
    kind: str
    reason: str
    ban: str | None = None   # why it may not be recomputed, when it is banned


@dataclass(frozen=True)
class _Structure:
    """The option-independent part of a graph's network, built once per CoreGraph."""

    tails: np.ndarray          # int64 [E]
    heads: np.ndarray          # int64 [E]
    kinds: np.ndarray          # int8 [E]: SAVE, USES, TO_SINK_*
    save_edge: np.ndarray      # int64 [N]: node -> its SAVE edge, -1 when it has none
    edge_node: np.ndarray      # int64 [E]: the node whose SAVE edge it is, else -1
    bannable: np.ndarray       # bool [N]: bans may apply (not view, must_recompute, backward)
    names: list[str]           # vertex names: source, sink, <id>_in, <id>_out, ...


@dataclass(frozen=True)
class CoreGraph:
    """A validated joint graph: ids unique, inputs known, no cycle. Nodes keep their order
    (results list nodes in it); the network structure is computed once and cached."""

    nodes: tuple[CoreNode, ...]
    _cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple):
            object.__setattr__(self, "nodes", tuple(self.nodes))
        _validate(self.nodes, self.index)

    @classmethod
    def with_input_positions(cls, nodes: tuple[CoreNode, ...],
                             input_positions: list[list[int]]) -> CoreGraph:
        """The graph of ``nodes`` from a front end that knows where each node's inputs are:
        ``input_positions[i]`` lists the positions of ``nodes[i].inputs``, in that order (each
        once). Checked as the constructor checks, without looking the input ids up (the fx
        adapter builds one graph of thousands of nodes per partition)."""
        graph = object.__new__(cls)
        object.__setattr__(graph, "nodes", nodes)
        object.__setattr__(graph, "_cache", {})
        graph.__dict__["input_indices"] = input_positions  # the cached property's value
        try:
            index = dict(zip([node.id for node in nodes], range(len(nodes))))
        except AttributeError:  # not a CoreNode: the index property says which
            index = {}
        if len(index) == len(nodes) and set(map(type, nodes)) <= {CoreNode}:
            graph.__dict__["index"] = index  # the property's answer: ids unique
        _validate(nodes, graph.index, input_positions)
        return graph

    @classmethod
    def from_dicts(cls, records: Iterable[Mapping[str, Any]]) -> CoreGraph:
        """A graph from plain dicts (one per node, JSON-like: ``inputs`` a list), checked like
        the constructor; a key that is not a CoreNode field is an error naming it and the node."""
        if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
            raise CoreGraphError(f"a graph is a list of node dicts, got {type(records).__name__}")
        return cls(tuple(_node_from_dict(i, record) for i, record in enumerate(records)))

    def to_dicts(self) -> list[dict[str, Any]]:
        """The nodes as plain dicts (fields at their default left out); ``from_dicts`` reads
        them back into an equal graph."""
        return [_node_to_dict(node) for node in self.nodes]

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Node id -> position."""
        index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if not isinstance(node, CoreNode):
                raise CoreGraphError(f"CoreGraph.nodes[{i}] is a {type(node).__name__}; "
                                     "expected a CoreNode")
            if index.setdefault(node.id, i) != i:
                raise CoreGraphError(f"duplicate node id '{node.id}' (nodes {index[node.id]} "
                                     f"and {i})")
        return index

    @functools.cached_property
    def input_indices(self) -> list[list[int]]:
        """Per node, the positions of the nodes it reads (each once, in first-read order)."""
        index = self.index
        return [list(dict.fromkeys(index[i] for i in node.inputs)) for node in self.nodes]

    @functools.cached_property
    def users(self) -> list[list[int]]:
        """Per node, the positions of the nodes that read it, in node order."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for i, inputs in enumerate(self.input_indices):
            for j in inputs:
                users[j].append(i)
        return users

    @functools.cached_property
    def structure(self) -> _Structure:
        return _build_structure(self)

    @functools.cached_property
    def nbytes(self) -> np.ndarray:
        return np.array([n.nbytes for n in self.nodes], dtype=np.float64)


def _validate(nodes: tuple[CoreNode, ...], index: Mapping[str, int],
              input_positions: list[list[int]] | None = None) -> None:
    """Unknown inputs, what the flags mean, and cycles; nodes out of topological order are
    fine (fast path first). ``input_positions``: where each node's inputs are, when the
    caller knows (``CoreGraph.with_input_positions``); else they are looked up by id."""
    in_order = True
    for i, node in enumerate(nodes):
        if input_positions is not None:
            reads = input_positions[i]
        else:
            reads = []
            for name in node.inputs:
                j = index.get(name)
                if j is None:
                    raise CoreGraphError(f"node '{node.id}' reads unknown input '{name}'")
                reads.append(j)
        for j in reads:
            in_order = in_order and j < i
            if nodes[j].in_backward and not node.in_backward:
                where = "forward" if node.forward else "not marked in_backward"
                raise CoreGraphError(
                    f"node '{node.id}' reads '{nodes[j].id}', a backward value, but is "
                    f"{where}; a node that reads a backward value is computed in the backward: "
                    "set in_backward=True (and forward=False)")
        if node.in_backward and node.forward:
            raise CoreGraphError(f"node '{node.id}' is both forward and in_backward; a node "
                                 "computed in the backward cannot be needed by the forward")
        if node.category in INPUT_CATEGORIES:
            _check_input(node)
    if not in_order:
        cycle = _find_cycle(nodes, index)
        if cycle:
            raise CoreGraphError(f"the graph has a cycle of {len(cycle) - 1} nodes (each node "
                                 f"reads the next): {_bounded_ids(cycle)}")


_SHOWN_IDS = 10  # ids an error message lists before it counts the rest


def _bounded_ids(ids: list[str]) -> str:
    """``a -> b -> ...``, at most ``_SHOWN_IDS`` ids and a count of the rest: an error about
    a 50,000-node cycle stays one line."""
    shown = " -> ".join(ids[:_SHOWN_IDS])
    rest = len(ids) - _SHOWN_IDS
    return shown if rest <= 0 else f"{shown} -> ... ({rest} more)"


def _check_input(node: CoreNode) -> None:
    """An input (category input/parameter/seed/tangent) exists before its graph runs: it reads
    nothing and is never recomputed; a forward input is forward, a tangent is backward."""
    if node.inputs:
        raise CoreGraphError(f"node '{node.id}' is an input (category '{node.category}') but "
                             f"reads {node.inputs[0]!r}; an input reads nothing (use a compute "
                             "category for a value computed from others)")
    if node.must_recompute:
        raise CoreGraphError(f"node '{node.id}' is an input (category '{node.category}') with "
                             "must_recompute=True; an input is never recomputed")
    if node.category != "tangent" and (not node.forward or node.in_backward):
        raise CoreGraphError(f"node '{node.id}' is a forward input (category "
                             f"'{node.category}') but forward={node.forward}, in_backward="
                             f"{node.in_backward}; a forward input has forward=True and "
                             "in_backward=False (it is saved, never recomputed)")


def check_release(graph: CoreGraph, release: Collection[str]) -> list[str]:
    """``release`` as a list of ids: each names a node, none an input (an input cannot be
    recomputed, so lifting its ban would only hide a mislabelled graph)."""
    names = _id_collection("release", release)
    for name in names:
        j = graph.index.get(name)
        if j is None:
            raise CoreGraphError(f"release names unknown node {name!r}")
        node = graph.nodes[j]
        if node.category in INPUT_CATEGORIES:
            raise CoreGraphError(f"release names '{name}', an input (category "
                                 f"'{node.category}'); inputs are never recomputed, so their "
                                 "ban cannot be lifted")
        if node.category in _REPLAY_CATEGORIES and not node.allow_recompute:
            raise CoreGraphError(
                f"release names '{name}', a{'n' if node.category == 'effectful' else ''} "
                f"{node.category} node without allow_recompute: recomputing it would "
                f"{_REPLAY_CATEGORIES[node.category]}; set allow_recompute=True on the node "
                "only if the front end replays it exactly")
    return names


# Categories a recompute would change the meaning of, and what it would do.
_REPLAY_CATEGORIES = {"random": "draw different random numbers than the forward did",
                      "effectful": "run its side effect a second time"}


def activation_bytes(graph: CoreGraph, indices: Iterable[int]) -> int:
    """Bytes of the values at ``indices`` that saving keeps alive beyond the step's inputs:
    inputs, parameters and seeds cost nothing (they exist before the step either way)."""
    per_node = graph._cache.get("activation bytes")
    if per_node is None:  # per graph: a budget search measures every candidate cut
        per_node = graph._cache["activation bytes"] = np.array(
            [0 if node.category in INPUT_CATEGORIES else node.nbytes for node in graph.nodes],
            dtype=object if any(node.nbytes >= 2**62 for node in graph.nodes) else np.int64)
    picked = per_node[np.asarray(list(indices), dtype=np.int64)]
    return int(picked.sum()) if picked.size else 0


def check_has_backward(graph: CoreGraph) -> None:
    """A graph to partition has a backward: a tangent input, a node ``in_backward``, or a
    value the backward needs that the forward does not compute (``backward`` and not
    ``forward``: a gradient of a joint whose tangents were made constants, which torch's
    partitioner splits too: the gradient is computed in the forward and saved, or recomputed).
    Without one (a training step traced whole, as ``jax.value_and_grad``'s jaxpr is: every
    gradient ``forward``) every node would run in the forward and every gradient would be
    "saved": an answer that means nothing, so it is refused."""
    if graph.nodes and not any(n.in_backward or n.category == "tangent"
                               or (n.backward and not n.forward) for n in graph.nodes):
        raise CoreGraphError(
            "the graph has no backward: no node is in_backward and none is a tangent, so there "
            "is nothing to split; mark the backward's nodes in_backward=True (those that "
            "depend on the gradient seed, which is a tangent input), or do not partition a "
            "forward-only graph")


# ---- loading from plain dicts ------------------------------------------------------------

NODE_FIELDS = tuple(f.name for f in fields(CoreNode))
_FIELD_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(CoreNode)}


def _node_from_dict(position: int, record: object) -> CoreNode:
    if not isinstance(record, Mapping):
        raise CoreGraphError(f"node {position} is a {type(record).__name__}; each node is a "
                             "dict of CoreNode fields")
    if "id" not in record:
        raise CoreGraphError(f"node {position} has no 'id'; valid keys: {', '.join(NODE_FIELDS)}")
    unknown = [key for key in record if key not in NODE_FIELDS]
    if unknown:
        raise CoreGraphError(f"node {record['id']!r} has unknown key {unknown[0]!r}; valid "
                             f"keys: {', '.join(NODE_FIELDS)}")
    return CoreNode(**record)


def _node_to_dict(node: CoreNode) -> dict[str, Any]:
    found: dict[str, Any] = {"id": node.id}
    for name in NODE_FIELDS[1:]:
        value = getattr(node, name)
        if value != _FIELD_DEFAULTS[name]:
            # JSON-ready: a list of ids, a plain int (a numpy integer is a valid nbytes).
            found[name] = list(value) if name == "inputs" else int(value) if name == "nbytes" \
                else value
    return found


def _find_cycle(nodes: tuple[CoreNode, ...], index: Mapping[str, int]) -> list[str] | None:
    """One cycle of ids ([a, b, ..., a], following "reads"), else None (iterative DFS)."""
    state = [0] * len(nodes)  # 0 new, 1 on the stack, 2 done
    for start in range(len(nodes)):
        if state[start]:
            continue
        stack: list[tuple[int, Iterable[str]]] = [(start, iter(nodes[start].inputs))]
        state[start] = 1
        while stack:
            i, pending = stack[-1]
            name = next(iter(pending), None)
            if name is None:
                state[i] = 2
                stack.pop()
                continue
            j = index[name]
            if state[j] == 1:
                path = [k for k, _ in stack]
                ids = [nodes[k].id for k in path[path.index(j):]]
                return [*ids, ids[0]]
            if state[j] == 0:
                state[j] = 1
                stack.append((j, iter(nodes[j].inputs)))
    return None


# ---- the network -------------------------------------------------------------------------

def _build_structure(graph: CoreGraph) -> _Structure:
    """Edges that do not depend on the options, in torch's order (per node: sink edges, save
    edge, uses); the bans are appended per call.

    Per node: computed in the backward, one edge (its input to the sink); else an edge to the
    sink if the backward needs it, then either an edge to the sink (must recompute) or its save
    edge and one edge to each user. Laid out with arrays (per-node counts, offsets), not an
    append per edge: a 50,000-node graph has over 100,000 edges."""
    nodes = graph.nodes
    n = len(nodes)
    flags = np.array([(node.in_backward, node.backward, node.must_recompute,
                       node.category == "view") for node in nodes], dtype=bool).reshape(n, 4)
    in_backward, backward, recompute, view = flags.T
    users = graph.users
    num_users = np.fromiter(map(len, users), dtype=np.int64, count=n)
    saves = ~in_backward & ~recompute
    # Edges per node, and where each node's edges start.
    counts = np.where(in_backward, 1, backward + np.where(recompute, 1, 1 + num_users))
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    num_edges = int(counts.sum())
    tails = np.empty(num_edges, dtype=np.int64)
    heads = np.empty(num_edges, dtype=np.int64)
    kinds = np.empty(num_edges, dtype=np.int8)
    v_in = 2 + 2 * np.arange(n, dtype=np.int64)
    v_out = v_in + 1

    def put(at: np.ndarray, tail: np.ndarray, head: np.ndarray | int, kind: int) -> None:
        tails[at], heads[at], kinds[at] = tail, head, kind

    put(starts[in_backward], v_in[in_backward], SINK, TO_SINK_COMPUTE)
    needed = ~in_backward & backward
    put(starts[needed], v_out[needed], SINK, TO_SINK_AVAILABLE)
    after = starts + (~in_backward & backward)  # the edge after the availability edge
    recomputed = ~in_backward & recompute
    put(after[recomputed], v_in[recomputed], SINK, TO_SINK_RECOMPUTE)
    save_edge = np.where(saves, after, -1)
    put(after[saves], v_in[saves], v_out[saves], SAVE)
    # Use edges: each saving node's users, in order, right after its save edge.
    per_node = np.where(saves, num_users, 0)
    total_uses = int(per_node.sum())
    if total_uses:
        owners = np.repeat(np.arange(n, dtype=np.int64), per_node)
        first = np.zeros(n, dtype=np.int64)
        np.cumsum(per_node[:-1], out=first[1:])
        rank = np.arange(total_uses, dtype=np.int64) - first[owners]
        readers = np.fromiter((u for i in np.flatnonzero(per_node).tolist() for u in users[i]),
                              dtype=np.int64, count=total_uses)
        put(after[owners] + 1 + rank, v_out[owners], 2 + 2 * readers, USES)
    bannable = saves & ~view
    edge_node = np.full(num_edges, -1, dtype=np.int64)
    edge_node[save_edge[saves]] = np.flatnonzero(saves)
    names = ["source", "sink"]
    for node in nodes:
        names += (node.id + "_in", node.id + "_out")
    return _Structure(tails, heads, kinds, save_edge, edge_node, bannable, names)


def default_save_costs(graph: CoreGraph, *, recompute_views: bool,
                       parameters_are_free: bool) -> np.ndarray:
    """Per node, the cost of saving it (see the module doc); ``save_cost`` overrides win."""
    cached = graph._cache.get(("costs", recompute_views, parameters_are_free))
    if cached is not None:
        return cached
    costs = np.zeros(len(graph.nodes), dtype=np.float64)
    by_bytes: list[int] = []  # priced by bytes, hops to the backward and materialization
    for i, node in enumerate(graph.nodes):
        if node.save_cost is not None:
            costs[i] = node.save_cost
        elif (not node.saveable or node.category == "opaque"
              or (recompute_views and node.category == "view")):
            costs[i] = math.inf
        elif node.category == "parameter" and parameters_are_free:
            costs[i] = 0.0
        elif node.category == "symbolic":
            costs[i] = node.nbytes
        else:
            by_bytes.append(i)
    if by_bytes:
        # int(nbytes * 1.1 ** hops), doubled when not materialized, for all of them at once:
        # the float products and truncations are the ones Python makes one by one.
        positions = np.array(by_bytes, dtype=np.int64)
        hops = np.clip(distances_from_backward(graph)[positions], 1, _DISTANCE_CAP)
        nbytes = np.array([graph.nodes[i].nbytes for i in by_bytes], dtype=np.float64)
        cost = np.trunc(nbytes * _DISTANCE_GROWTH[hops])
        costs[positions] = np.where(materialized(graph)[positions], cost, cost * 2)
    graph._cache[("costs", recompute_views, parameters_are_free)] = costs
    return costs


def _ban_reasons(graph: CoreGraph, bans: Mapping[str, str] | None,
                 release: Collection[str], rules: tuple[str, ...] = (),
                 max_dist_from_bw: int = MAX_DIST_FROM_BW) -> dict[int, str]:
    """Position -> ban reason: the node's own, the call's, the category's, the per-node rules'
    (in node order), then the graph-wide rules' (in the order made)."""
    index = graph.index
    call = _positions(graph, bans if bans is not None else {})
    names = _id_collection("release", release)
    unknown = [name for name in names if name not in index]
    if unknown:
        raise CoreGraphError(f"release names unknown node '{unknown[0]}'")
    released = {index[name] for name in names}
    bannable = graph.structure.bannable
    found: dict[int, str] = {}
    for i in sorted(_candidates(graph) | call.keys()):
        if not bannable[i] or i in released:
            continue
        node = graph.nodes[i]
        reason = node.ban or call.get(i)
        if reason is None and node.forward and not node.allow_recompute:
            reason = CATEGORY_BANS.get(node.category)
        if reason is not None:
            found[i] = reason
    if not rules:
        return found
    eligible = bannable.copy()
    eligible[list(released)] = False
    return apply_rules(graph, rules, found, eligible, max_dist_from_bw)


def _positions(graph: CoreGraph, bans: Mapping[str, str]) -> dict[int, str]:
    """The call's bans by position; an unknown id is an error."""
    index = graph.index
    if not isinstance(bans, Mapping):
        raise CoreGraphError(f"bans must be a mapping of node id to reason, got {bans!r}")
    found = {}
    for name, why in bans.items():
        if name not in index:
            raise CoreGraphError(f"ban names unknown node {name!r}")
        if not isinstance(why, str) or not why:
            raise CoreGraphError(f"ban of node '{name}' is {why!r}; must be a non-empty string "
                                 "(the reason)")
        found[index[name]] = why
    return found


def _candidates(graph: CoreGraph) -> set[int]:
    """Nodes banned by the description itself (own reason or category), computed once."""
    cached = graph._cache.get("candidates")
    if cached is None:
        cached = graph._cache["candidates"] = {
            i for i, node in enumerate(graph.nodes)
            if node.ban is not None or (node.forward and not node.allow_recompute
                                        and node.category in CATEGORY_BANS)}
    return cached


def build_network(graph: CoreGraph, banned: Mapping[int, str], *, recompute_views: bool = False,
                  parameters_are_free: bool = True, priced_by_bytes: bool = False) -> FlowNetwork:
    """The flow network of ``graph`` with the given bans (position -> reason).
    ``priced_by_bytes``: a value that can be saved costs what the one measure of saved bytes
    counts (inputs, parameters and seeds 0, any other value its ``nbytes``; no bias towards
    the backward), so the cut saves the fewest bytes its bans allow (a budget's least-memory
    cuts)."""
    structure = graph.structure
    capacities = np.full(structure.tails.shape[0] + len(banned), math.inf, dtype=np.float64)
    has_save = structure.save_edge >= 0
    costs = default_save_costs(graph, recompute_views=recompute_views,
                               parameters_are_free=parameters_are_free)
    if priced_by_bytes:
        costs = np.where(np.isinf(costs), math.inf, _measured_bytes(graph))
    capacities[structure.save_edge[has_save]] = costs[has_save]
    ban_heads = 2 + 2 * np.fromiter(banned, dtype=np.int64, count=len(banned))
    return FlowNetwork(
        num_nodes=len(structure.names), source=SOURCE, sink=SINK,
        tails=np.concatenate([structure.tails, np.full(len(banned), SOURCE, dtype=np.int64)]),
        heads=np.concatenate([structure.heads, ban_heads]),
        capacities=capacities, names=structure.names,
    )


def _measured_bytes(graph: CoreGraph) -> np.ndarray:
    """Per node, what saving it adds to ``activation_bytes`` (float64, cached)."""
    cached = graph._cache.get("measured bytes")
    if cached is None:
        cached = graph._cache["measured bytes"] = np.array(
            [0.0 if node.category in INPUT_CATEGORIES else float(node.nbytes)
             for node in graph.nodes], dtype=np.float64)
    return cached


def edge_reason(graph: CoreGraph, network: FlowNetwork, banned: Mapping[int, str],
                edge: int) -> str:
    """Why edge ``edge`` of ``network`` exists (shown for infinite edges on an error)."""
    structure = graph.structure
    if edge >= structure.tails.shape[0]:
        reason = list(banned.values())[edge - structure.tails.shape[0]]
        return f"cannot recompute: {reason}"
    kind = int(structure.kinds[edge])
    tail = (int(network.tails[edge]) - 2) // 2
    head = (int(network.heads[edge]) - 2) // 2
    if kind == SAVE:
        return _save_reason(graph, tail, float(network.capacities[edge]))
    if kind == USES:
        return f"{graph.nodes[head].id} uses {graph.nodes[tail].id}"
    return {TO_SINK_COMPUTE: "must be computed in backward",
            TO_SINK_AVAILABLE: "must be available for backward",
            TO_SINK_RECOMPUTE: "must recompute: checkpoint annotation"}[kind]


def _save_reason(graph: CoreGraph, i: int, cost: float) -> str:
    if not math.isinf(cost):
        return "save cost"
    node = graph.nodes[i]
    if node.save_cost is None and (node.category == "opaque" or not node.saveable):
        marked = "category 'opaque'" if node.category == "opaque" else "saveable=False"
        return f"cannot save: {marked} (not a tensor)"
    if node.save_cost is None and node.category == "view":
        return "cannot save: view op (recompute_views=True)"
    return "cannot save: infinite save cost"


def _raise_infeasible(graph: CoreGraph, network: FlowNetwork, banned: Mapping[int, str],
                      path: list[int]) -> None:
    steps = []
    for e in path:
        head = network.names[int(network.heads[e])]
        steps.append((head.removesuffix("_in").removesuffix("_out"),
                      edge_reason(graph, network, banned, e)))
    raise InfeasibleMinCutError(steps, hint=InfeasibleMinCutError.CORE_HINT)


# ---- solving and reading the cut back ----------------------------------------------------

@dataclass(frozen=True)
class CorePartition:
    """The answer: what to save, what it costs, and (``decisions``) why for every node."""

    graph: CoreGraph
    saved_indices: np.ndarray        # int64, positions in graph order
    cost: float                      # the cut's value: total save cost of the saved nodes
    banned_at: dict[int, str]        # position -> ban reason (see _ban_reasons for the order)
    network: FlowNetwork
    cut: MinCut
    solver: str

    @property
    def saved(self) -> tuple[str, ...]:
        """Ids of the saved nodes, in graph order."""
        return tuple(self.graph.nodes[i].id for i in self.saved_indices.tolist())

    @property
    def saved_bytes(self) -> int:
        """The one measure of saved bytes (as the fx path's): what saving costs in memory,
        inputs, parameters and seeds free (they are alive anyway)."""
        return activation_bytes(self.graph, self.saved_indices.tolist())

    @property
    def banned(self) -> dict[str, str]:
        """Id -> why it may not be recomputed, in graph order."""
        return {self.graph.nodes[i].id: why for i, why in self.banned_at.items()}

    @functools.cached_property
    def _saved_set(self) -> set[int]:
        return set(self.saved_indices.tolist())

    @functools.cached_property
    def decisions(self) -> dict[str, CoreDecision]:
        """Id -> decision, in graph order."""
        return {node.id: self._decide(i) for i, node in enumerate(self.graph.nodes)}

    @property
    def recompute_runtime(self) -> float:
        """Summed runtime of the nodes the backward recomputes."""
        return float(sum(self.graph.nodes[i].runtime
                         for i, d in enumerate(self.decisions.values()) if d.kind == RECOMPUTED))

    @functools.cached_property
    def _reaches_sink(self) -> np.ndarray:
        """Vertices with a path to the sink over uncut edges: what the backward computes."""
        network = self.network
        kept = np.ones(network.num_edges, dtype=bool)
        kept[self.cut.cut_edges(network)] = False
        into: dict[int, list[int]] = {}
        for tail, head in zip(network.tails[kept].tolist(), network.heads[kept].tolist()):
            into.setdefault(head, []).append(tail)
        seen = np.zeros(network.num_nodes, dtype=bool)
        seen[network.sink] = True
        pending = [network.sink]
        while pending:
            for tail in into.get(pending.pop(), ()):
                if not seen[tail]:
                    seen[tail] = True
                    pending.append(tail)
        return seen

    def _decide(self, i: int) -> CoreDecision:
        node = self.graph.nodes[i]
        ban = self.banned_at.get(i)
        if node.in_backward:
            return CoreDecision(node.id, BACKWARD, "backward only", ban)
        if i in self._saved_set:
            reason = "saved: cut" if ban is None else f"saved: cut; banned: {ban}"
            return CoreDecision(node.id, SAVED, reason, ban)
        if self._reaches_sink[2 + 2 * i]:
            if not node.forward:
                return CoreDecision(node.id, BACKWARD, "backward only", ban)
            why = " (must recompute)" if node.must_recompute else ""
            return CoreDecision(node.id, RECOMPUTED, f"recomputed in backward{why}", ban)
        if ban is not None:
            return CoreDecision(node.id, FORWARD, f"banned: {ban}", ban)
        return CoreDecision(node.id, FORWARD, "forward only: not needed by backward", ban)


def ban_reasons(graph: CoreGraph, *, bans: Mapping[str, str] | None = None,
                release: Collection[str] = (), rules: Collection[str] = (),
                max_dist_from_bw: int = MAX_DIST_FROM_BW) -> dict[int, str]:
    """What ``partition`` bans under these options (position -> reason, in its order),
    without building the network or cutting: a budget search that recomputes every
    candidate needs only the bans. The options mean what they mean for ``partition``."""
    check_release(graph, release)
    try:
        names = rule_names(rules)
    except RuleError as exc:
        raise CoreGraphError(str(exc)) from None
    if not _is_int(max_dist_from_bw) or max_dist_from_bw < 0:
        raise CoreGraphError(f"max_dist_from_bw must be an int >= 0, got {max_dist_from_bw!r}")
    return _ban_reasons(graph, bans, release, names, int(max_dist_from_bw))


def partition(graph: CoreGraph | Iterable[CoreNode], *, solver: str = SOLVER_DEFAULT,
              bans: Mapping[str, str] | None = None, release: Collection[str] = (),
              recompute_views: bool = False, parameters_are_free: bool = True,
              rules: Collection[str] = (),
              max_dist_from_bw: int = MAX_DIST_FROM_BW) -> CorePartition:
    """The cheapest set of values to save so the backward can run (a minimum cut).

    ``bans``: extra ban reasons for this call (id -> reason; the node's own ``ban`` wins).
    ``release``: ids whose bans are lifted. ``solver``: a name of ``mincut.SOLVERS``.
    ``rules``: names of torch's ban rules to apply (``rules.RULES``; default none: only the
    category bans; ``rules.TORCH_DEFAULT_RULES`` is torch's default set).
    ``max_dist_from_bw``: the hops beyond which ``too_far_from_backward`` bans.
    Raises InfeasibleMinCutError (with the offending path) when nothing finite separates the
    forward inputs from what the backward needs.
    """
    if not isinstance(graph, CoreGraph):
        graph = CoreGraph(tuple(graph))
    for name, value in (("recompute_views", recompute_views),
                        ("parameters_are_free", parameters_are_free)):
        if not isinstance(value, bool):
            raise CoreGraphError(f"{name} must be True or False, got {value!r}")
    if not isinstance(solver, str):
        raise CoreGraphError(f"solver must be a solver name (a string), got {solver!r}")
    check_has_backward(graph)
    banned = ban_reasons(graph, bans=bans, release=release, rules=rules,
                         max_dist_from_bw=max_dist_from_bw)
    return partition_banned(graph, banned, solver=solver, recompute_views=recompute_views,
                            parameters_are_free=parameters_are_free)


def partition_banned(graph: CoreGraph, banned: dict[int, str], *, solver: str = SOLVER_DEFAULT,
                     recompute_views: bool = False, parameters_are_free: bool = True,
                     priced_by_bytes: bool = False) -> CorePartition:
    """``partition`` with the bans already resolved (position -> reason, node order), as
    ``ban_reasons`` gives them: a budget search cuts many times with bans that differ only by
    the nodes it releases, and skips checking and resolving them again.
    ``priced_by_bytes``: see ``build_network``."""
    network = build_network(graph, banned, recompute_views=recompute_views,
                            parameters_are_free=parameters_are_free,
                            priced_by_bytes=priced_by_bytes)
    cut = get_solver(solver)(network)
    if math.isinf(cut.value):
        path = infinite_path(network)
        if path is None:
            raise AssertionError(f"solver {solver!r} found no finite cut on a feasible network")
        _raise_infeasible(graph, network, banned, path)
    edges = cut.cut_edges(network)
    nodes = graph.structure.edge_node[edges[edges < graph.structure.tails.shape[0]]]
    if nodes.size != edges.size or (nodes < 0).any():
        raise AssertionError(f"solver {solver!r} cut an infinite edge")
    saved = np.sort(nodes)
    log.debug("core min-cut (%s) value %s saves %d nodes", solver, cut.value, saved.size)
    return CorePartition(graph, saved, float(cut.value), banned, network, cut, solver)
