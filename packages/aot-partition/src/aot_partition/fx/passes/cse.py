"""Common-subexpression elimination of the joint graph before partitioning."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..joint import (
    BYTES_REGION_KEY,
    MERGED_DUPLICATE_OF,
    PLAIN_LEAVES,
    TORCH_REGION_KEY,
    is_random,
    is_seeded_target,
)

_NEVER_MERGED = (torch.ops.aten.empty,)


def _is_mutating(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _freeze(value: Any, env: dict[fx.Node, fx.Node]) -> Any:
    """A hashable key for an argument, with nodes replaced by their surviving copy.

    Nodes stand for themselves (they hash by identity, and every other leaf becomes a
    ``(type, value)`` pair, so ``1``, ``1.0`` and ``True`` stay apart).
    """
    if isinstance(value, fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return (type(value), tuple([_freeze(v, env) for v in value]))
    if isinstance(value, dict):
        return (dict, tuple([(k, _freeze(v, env)) for k, v in value.items()]))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", id(value.node))
    return (type(value), value)


def _freeze_args(args: tuple[Any, ...], env: dict[fx.Node, fx.Node]) -> Any:
    """``_freeze(args, env)`` for a node's ``args`` tuple, the usual leaves inline (this
    runs once per node of the joint)."""
    frozen: list[Any] = []
    for value in args:
        kind = type(value)
        if kind is fx.Node:
            frozen.append(env[value])
        elif kind in PLAIN_LEAVES:
            frozen.append((kind, value))
        else:
            frozen.append(_freeze(value, env))
    return (type(args), tuple(frozen))


_NO_KWARGS = (dict, ())
# target -> never merged whatever its arguments, asked once per target. Only properties of
# the op go in here (mutation, aten.empty); whether a seeded op draws from the RNG depends on
# the call's arguments (attention's dropout_p), so it is decided per node, never cached.
_NEVER_MERGED_TARGETS: dict[Any, bool] = {}
# target -> tagged nondeterministic_seeded (random for some arguments), per target as well.
_SEEDED_TARGETS: dict[Any, bool] = {}


def _never_merged_target(target: Any) -> bool:
    return (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable) or (
        getattr(target, "overloadpacket", target) in _NEVER_MERGED)


def _cached(cache: dict[Any, bool], verdict_of: Callable[[Any], bool], target: Any) -> bool:
    try:
        return cache[target]
    except KeyError:
        verdict = cache[target] = verdict_of(target)
        return verdict
    except TypeError:  # an unhashable target
        return verdict_of(target)


def _unmergeable(node: fx.Node, verdicts: dict[int, tuple[bool, bool]]) -> bool:
    """Never merge a mutating op, aten.empty, or a call that draws from the RNG (decided
    from this call's arguments: attention at dropout_p=0 draws nothing and merges).
    ``verdicts``: id(target) -> (never merged, seeded), for one pass over one graph (its
    targets stay alive; an OpOverload hashes in Python, an id does not)."""
    target = node.target
    verdict = verdicts.get(id(target))
    if verdict is None:
        verdict = verdicts[id(target)] = (
            _cached(_NEVER_MERGED_TARGETS, _never_merged_target, target),
            _cached(_SEEDED_TARGETS, is_seeded_target, target))
    never_merged, seeded = verdict
    return never_merged or (seeded and is_random(node))


def _region(node: fx.Node) -> tuple[Any, Any] | None:
    """The node's region budget annotation (regions.py), as written: two regions with
    different budgets must keep their own copies of an identical computation."""
    custom = node.meta.get("custom")
    if not isinstance(custom, dict):
        return None
    return custom.get(TORCH_REGION_KEY), custom.get(BYTES_REGION_KEY)


def _storages(node: fx.Node) -> list[Any]:
    """The storages of a node's value: one for a tensor, one per tensor of a tuple (a
    multi-output op such as attention: its getitems return these storages)."""
    val = node.meta.get("val")
    values = val if isinstance(val, (tuple, list)) else (val,)
    storages = []
    for value in values:
        if isinstance(value, torch.Tensor):
            try:
                storages.append(StorageWeakRef(value.untyped_storage()))
            except (NotImplementedError, RuntimeError):
                pass
    return storages


class _AliasesOutput:
    """Whether a node's value shares storage with a graph output, asked only when a merge
    is at stake: reading storages of fake tensors is slow, and few nodes ever match."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.verdicts: dict[fx.Node, bool] = {}

    @functools.cached_property
    def storages(self) -> set[Any]:
        """The outputs' storages, read when the first merge is at stake."""
        output = next(iter(self.graph.find_nodes(op="output")))
        return {s for n in output.all_input_nodes for s in _storages(n)}

    def __call__(self, node: fx.Node) -> bool:
        verdict = self.verdicts.get(node)
        if verdict is None:
            # A multi-output op aliases an output when any of its items does: merging two
            # calls whose items are returned would return one tensor twice.
            verdict = self.verdicts[node] = bool(self.storages) and any(
                s in self.storages for s in _storages(node))
        return verdict


def eliminate_common_subexpressions(
    graph: fx.Graph, keep_apart: Callable[[fx.Node], Hashable] | None = None
) -> bool:
    """Merge call_function nodes with equal target, arguments, checkpoint annotation and
    region budget annotation, and erase the duplicates; True if anything was merged (the
    caller recompiles its module).

    Random, mutating and output-aliasing nodes are never merged; a mutation starts a new
    epoch so reads before and after it stay distinct. Nodes with different ``keep_apart``
    keys are never merged either. ``merge_common_subexpressions`` is the same merge, undoable.
    """
    merged = merge_common_subexpressions(graph, keep_apart)
    for node in merged.duplicates:
        graph.erase_node(node)
    return bool(merged.duplicates)


@dataclass
class MergedSubexpressions:
    """What merge_common_subexpressions changed, so that ``undo`` can put it back exactly."""

    duplicates: list[fx.Node] = field(default_factory=list)
    detached: set[fx.Node] = field(default_factory=set)  # the duplicates, for lookups
    original_inputs: dict[fx.Node, tuple[Any, Any]] = field(default_factory=dict)
    # Rewiring moves users within their inputs' ``users`` dicts; undo restores the order too.
    original_users: dict[fx.Node, list[fx.Node]] = field(default_factory=dict)

    def rewire(self, node: fx.Node, args: Any, kwargs: Any) -> None:
        touched: list[fx.Node] = list(node.all_input_nodes)
        fx.map_arg((args, kwargs), touched.append)
        for input_node in touched:
            if input_node not in self.original_users:
                self.original_users[input_node] = list(input_node.users)
        self.original_inputs.setdefault(node, (node.args, node.kwargs))
        node.args, node.kwargs = args, kwargs

    def detach(self, duplicate: fx.Node, survivor: fx.Node) -> None:
        """Cut ``duplicate`` off its inputs, marked so that extraction never copies it."""
        self.duplicates.append(duplicate)
        self.detached.add(duplicate)
        self.rewire(duplicate, (), {})
        duplicate.meta[MERGED_DUPLICATE_OF] = survivor

    def undo(self) -> None:
        """Give every rewired node its original inputs back: the graph is as it was."""
        for node in self.duplicates:
            node.meta.pop(MERGED_DUPLICATE_OF, None)
        for node, (args, kwargs) in self.original_inputs.items():
            node.args, node.kwargs = args, kwargs
        for node, users in self.original_users.items():
            if list(node.users) != users:
                node.users.clear()
                node.users.update(dict.fromkeys(users))
        self.original_inputs.clear()
        self.original_users.clear()
        self.duplicates.clear()
        self.detached.clear()


class _TargetTokens:
    """Stand-ins for targets in merge keys: equal targets (as a dict sees them) get the same
    int, so keys compare as they would holding the targets, but hash without calling an
    OpOverload's Python ``__hash__`` once per node: targets are looked up by id, each
    target object hashed once. For one pass over one graph."""

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[int, Any]] = {}  # id -> (token, target: keeps the id)
        self.by_target: dict[Any, int] = {}

    def __call__(self, target: Any) -> int:
        found = self.by_id.get(id(target))
        if found is None:
            # TypeError for an unhashable target, as a key holding it would raise.
            token = self.by_target.setdefault(target, len(self.by_target))
            found = self.by_id[id(target)] = (token, target)
        return found[0]


def merge_common_subexpressions(
    graph: fx.Graph, keep_apart: Callable[[fx.Node], Hashable] | None = None
) -> MergedSubexpressions:
    """The merge of eliminate_common_subexpressions, done so that it can be undone.

    Users of a duplicate are rewired to the node it duplicates, and the duplicate is
    detached from its own inputs: it stays in the graph, isolated (no inputs, no users),
    so that the graph computes the merged result with no node erased. ``undo`` restores
    the original graph exactly, so a partitioner can merge the joint graph a caller hands
    it and give it back with its generated code still matching, without regenerating it.

    Two nodes merge only if they call the same target on the same input nodes (after
    merging), so a node's full key (its arguments frozen, its annotations) is built only
    once a second node with that target and those inputs turns up; most nodes have none.
    """
    aliases_output = _AliasesOutput(graph)
    merged = MergedSubexpressions()
    env: dict[fx.Node, fx.Node] = {}
    seen: dict[Any, fx.Node] = {}
    # (target token, input nodes after merging) -> the first such node and its epoch, until
    # a second one comes (then None: its key is in ``seen``).
    pending: dict[tuple[Any, ...], tuple[fx.Node, int] | None] = {}
    verdicts: dict[int, tuple[bool, bool]] = {}
    target_token = _TargetTokens()
    detached = merged.detached
    epoch = 0

    def key_of(node: fx.Node, epoch: int) -> tuple[Any, ...] | None:
        kwargs = node.kwargs
        try:
            key = (target_token(node.target), _freeze_args(node.args, env),
                   _freeze(kwargs, env) if kwargs else _NO_KWARGS,
                   node.meta.get("recompute"), node.meta.get("ac_graph_id"), epoch,
                   _region(node), keep_apart(node) if keep_apart is not None else None)
            hash(key)
        except TypeError:  # unhashable constant argument: leave the node alone
            return None
        return key

    for node in graph.nodes:
        env[node] = node
        inputs = node._input_nodes
        rewired = bool(detached) and not detached.isdisjoint(inputs)
        if node.op != "call_function" or _unmergeable(node, verdicts):
            epoch += node.op == "call_function" and _is_mutating(node)
        else:
            try:
                token = target_token(node.target)
            except TypeError:  # an unhashable target: never merged
                token = None
            if token is not None:
                mapped = (tuple(dict.fromkeys([env[a] for a in inputs])) if rewired
                          else tuple(inputs))
                candidates = (token, mapped)
                if candidates not in pending:
                    pending[candidates] = (node, epoch)
                else:
                    first_seen = pending[candidates]
                    if first_seen is not None:  # the first of these: keyed now, as then
                        pending[candidates] = None
                        first_key = key_of(*first_seen)
                        if first_key is not None:
                            seen[first_key] = first_seen[0]
                    key = key_of(node, epoch)
                    first = seen.get(key) if key is not None else None
                    # Merging values that alias graph outputs would change the outputs'
                    # aliasing: such a node neither merges nor is merged into.
                    if first is not None and not aliases_output(node):
                        if not aliases_output(first):
                            env[node] = first
                            merged.detach(node, first)
                            continue
                        seen[key] = node
                    elif first is None and key is not None:
                        seen[key] = node
        # Only the detached duplicates map to another node in env.
        if rewired:
            merged.rewire(node, fx.map_arg(node.args, env.__getitem__),
                          fx.map_arg(node.kwargs, env.__getitem__))
    return merged
