"""The torch.fx front end of the graph-agnostic core: an fx joint graph described in core terms.

``describe`` turns the joint graph into a ``core.CoreGraph`` once per partition: per node its
inputs, bytes, category, op name, where it is needed (from ``NodeInfo``), whether its op fuses
and is in the allowlist of recomputable ops, checkpoint marks, and the bans only fx can see
(SAC tags, un-replayable RNG, opaque objects). The core does the rest: the save costs, torch's
ban rules (``core.rules``, named as ``policy.active_rule_names`` lists them), the network, the
cut and every reason. ``cut_fx_graph`` makes one cut; ``core_graph_of`` is the description a
tool or test can hand to ``core.partition`` itself (``core_call_of`` adds the call's options).

The memory-budget search cuts the same joint several times with different options and
``dont_ban`` sets; a ``NetworkMemo`` that the caller owns keeps the description (and, inside
it, the core's network structure and rule answers) across those cuts.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import py_sym_types

from ..config import MinCutOptions, PartitionConfig
from ..core.graph import CoreGraph, CoreNode, CorePartition, ban_reasons, partition
from ..core.rules import use_distances
from ..errors import PartitionError
from .classify import classify, default_op_types
from .collectives import is_collective
from .context import PolicyContext, active_rule_names, is_effectful
from .joint import aten_packet, is_bwd_seed_offset, is_fwd_seed_offset, is_random, is_tangent
from .passes.recompute_tags import RECOMPUTE_POLICIES, must_save
from .passes.rng import replay_obstacle
from .prepare import prepared_joint
from .sizes import is_opaque_value, node_nbytes, size_hint

log = logging.getLogger(__name__)

# Why an opaque object computed in the forward (a script object an op returns) is saved.
OPAQUE_BAN = "opaque object: never recomputed"
_CONSTANTS = (torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.lift_fresh.default)


@dataclass
class FxDescription:
    """An fx joint graph in core terms, plus the map back to fx nodes."""

    graph: CoreGraph
    nodes: list[fx.Node]              # core position -> fx node
    never_banned: tuple[str, ...]     # ids released in every cut (SymFloats: can_be_banned)
    exempt: frozenset[fx.Node]        # never banned whatever dont_ban says (can_be_banned)
    # position of each node in ``nodes``
    positions: dict[fx.Node, int]


@dataclass(frozen=True)
class _OpFacts:
    """What a node's target says, whoever calls it."""

    category: str
    fusible: bool
    recomputable: bool
    op: str


# A placeholder's or get_attr's facts: its target is a name, no op (every placeholder has
# its own, so the memo would miss on each).
_NOT_A_CALL = _OpFacts("other", False, False, "")


def _facts_of(node: fx.Node, ctx: PolicyContext) -> _OpFacts:
    op_types = ctx.op_types
    packet = aten_packet(node)
    return _OpFacts(_op_category(node, ctx, packet), op_types.is_fusible(node),
                    op_types.is_recomputable(node), str(packet))


def _op_category(node: fx.Node, ctx: PolicyContext, packet: Any) -> str:
    """The category an op's target gives every node that calls it (core.CATEGORIES)."""
    op_types = ctx.op_types
    if op_types.is_view(node):
        return "view"
    if is_effectful(node, ctx.effects):
        return "effectful"
    if is_collective(node):
        return "collective"
    if op_types.is_random(node) or is_random(node):
        return "random"
    if op_types.is_compute_intensive(node):
        return "compute"
    if packet is torch.ops.aten.cat:
        return "concat"
    return "pointwise" if op_types.is_fusible(node) else "other"


_SAVEABLE_TYPES = (torch.Tensor, BackwardState, *py_sym_types)


def _saveable(val: Any) -> bool:
    """A tensor, a symbolic scalar, an opaque object or backward state (both priced 0); not
    None nor a tuple of outputs."""
    return isinstance(val, _SAVEABLE_TYPES) or is_opaque_value(val)


def _placeholder_category(node: fx.Node, ctx: PolicyContext) -> str:
    if is_tangent(node) or is_bwd_seed_offset(node):
        return "tangent"
    if is_fwd_seed_offset(node):
        return "seed"
    return "parameter" if node in ctx.node_info.static_lifetime_inputs else "input"


def _other_nbytes(node: fx.Node, val: Any) -> int:
    """Bytes charged for saving a node whose value is neither a tensor nor a symbolic scalar
    (0 for opaque objects and backward state: never priced as memory)."""
    try:
        return node_nbytes(node)
    except (PartitionError, TypeError):
        return 0


def describe(joint_graph: fx.Graph, ctx: PolicyContext) -> FxDescription:
    """The core description of ``joint_graph`` (every node but the output).

    Per node: its inputs, bytes, category, op facts, where it is needed and the bans only fx
    can see, with the checks of ``must_recompute`` and ``can_be_banned`` inlined on the meta
    and value in hand. This runs once per joint node (thousands per partition), so it is one
    loop with its lookups hoisted, and the core graph gets the input positions it would
    otherwise look up by id.
    """
    nodes = [n for n in joint_graph.nodes if n.op != "output"]
    outputs = {a for n in joint_graph.find_nodes(op="output") for a in n._input_nodes}
    info = ctx.node_info
    tangents_closure, required_fw, required_bw = (info.tangents_closure, info.required_fw,
                                                  info.required_bw)
    # id(target) -> facts: the targets live as long as the graph, and an OpOverload hashes
    # in Python.
    facts_by_target: dict[int, _OpFacts] = {}
    never_banned: list[str] = []
    exempt: set[fx.Node] = set()
    positions: dict[fx.Node, int] = {}
    core_nodes: list[CoreNode] = []
    input_positions: list[list[int]] | None = []
    new_node = CoreNode.unchecked_from
    getitem, tensor, symfloat_type = operator.getitem, torch.Tensor, torch.SymFloat
    # C-level maps over each node's inputs (a comprehension is a call of its own in 3.11)
    position_of, name_of = positions.__getitem__, operator.attrgetter("name")
    for position, node in enumerate(nodes):
        positions[node] = position
        meta = node.meta
        val = meta.get("val")
        op = node.op
        is_call = op == "call_function"
        in_backward = node in tangents_closure
        forward = node in required_fw
        annotated_recompute = meta.get("recompute") in RECOMPUTE_POLICIES  # must_recompute
        recompute = not in_backward and annotated_recompute
        if not (in_backward or recompute) and is_call and "val" not in meta:
            node_nbytes(node)  # raises MissingMetadataError unless the op returns nothing
        if is_call:
            facts = facts_by_target.get(id(node.target))
            if facts is None:
                facts = facts_by_target[id(node.target)] = _facts_of(node, ctx)
        else:
            facts = _NOT_A_CALL
        is_tensor = isinstance(val, tensor)
        symbolic = not is_tensor and isinstance(val, py_sym_types)  # is_sym_node
        if op == "placeholder":
            category = _placeholder_category(node, ctx)
        else:
            category = "symbolic" if symbolic else facts.category
        symfloat = symbolic and isinstance(val, symfloat_type)
        exempt_node = annotated_recompute or category == "view" or symfloat  # not can_be_banned
        if symfloat:
            never_banned.append(node.name)
        if exempt_node:
            exempt.add(node)
        plain_call = is_call and node.target is not getitem
        ban = None
        if not (in_backward or recompute or exempt_node):
            if (not is_tensor and is_opaque_value(val)
                    and category not in ("input", "parameter", "seed")):
                ban = OPAQUE_BAN
            elif forward and plain_call:
                if must_save(node):
                    ban = "MUST_SAVE annotation"
                elif category == "random":
                    ban = replay_obstacle(node)
        read = node._input_nodes  # all_input_nodes without its list copy (see joint.py)
        if input_positions is not None:
            try:
                input_positions.append(list(map(position_of, read)))
            except KeyError:  # an input after its reader: the core finds it by id (and checks)
                input_positions = None
        if is_tensor:  # sizes.tensor_nbytes, inline
            numel = val.numel()
            nbytes = (numel if type(numel) is int else size_hint(numel)) * val.dtype.itemsize
            saveable = True
        elif symbolic:
            nbytes = 4 if symfloat else 1  # sym_node_size
            saveable = True
        else:
            nbytes = _other_nbytes(node, val)
            saveable = _saveable(val)
        # Valid by construction (names unique, categories known, sizes >= 0): no checks.
        core_nodes.append(new_node({
            "id": node.name,
            "inputs": tuple(map(name_of, read)),
            "nbytes": nbytes,
            "category": category,
            "forward": forward,
            "backward": node in required_bw,
            "in_backward": in_backward,
            # fx replays a recomputed random op's RNG state (passes/rng.py): its ban is the
            # rules' call; exempt nodes (can_be_banned) get no category ban either.
            "allow_recompute": category == "random" or exempt_node,
            "must_recompute": recompute,
            "save_cost": None,
            "saveable": saveable,
            "ban": ban,
            "op": facts.op,
            "fusible": facts.fusible,
            "recomputable": facts.recomputable,
            "output": node in outputs,
            "trivial": not plain_call or node.target in _CONSTANTS,
            "runtime": 0.0,
        }))
    graph = (CoreGraph(tuple(core_nodes)) if input_positions is None
             else CoreGraph.with_input_positions(tuple(core_nodes), input_positions))
    # The classification counted the hops to the backward already (the core's definition).
    dist = info.dist_from_bw
    use_distances(graph, np.fromiter((dist.get(n, 0) for n in nodes), dtype=np.int64,
                                     count=len(nodes)))
    return FxDescription(graph, nodes, tuple(never_banned), frozenset(exempt), positions)


class NetworkMemo:
    """The description of one joint, kept across the cuts of a partition (the core caches its
    network structure, save costs and rule answers on it).

    It reads only the graph, the classification, the op categories and the flags, none of
    which change between the cuts of one partition; the memory-budget search hands the same
    memo to each. Entries are keyed by everything they read, so one memo is safe to share
    between contexts.
    """

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[tuple[Any, ...], Any]] = {}

    def _get(self, key: tuple[Any, ...], holds: tuple[Any, ...], make: Any) -> Any:
        entry = self._entries.get(key)
        # Holding the keyed objects keeps their ids unique while the entry lives.
        if entry is None or any(a is not b for a, b in zip(entry[0], holds)):
            entry = self._entries[key] = (holds, make())
        return entry[1]

    def description(self, joint_graph: fx.Graph, ctx: PolicyContext) -> FxDescription:
        holds = (joint_graph, ctx.node_info, ctx.op_types)
        key = ("describe", *map(id, holds), ctx.recompute_views, ctx.treat_params_as_free)
        return self._get(key, holds, lambda: describe(joint_graph, ctx))


def core_options(desc: FxDescription, ctx: PolicyContext,
                 dont_ban: Collection[fx.Node] = ()) -> dict[str, Any]:
    """The keyword arguments of ``core.partition`` for one cut of ``desc`` under ``ctx``."""
    return {
        "rules": active_rule_names(ctx.options),
        "max_dist_from_bw": ctx.max_dist_from_bw,
        "release": [*desc.never_banned, *(n.name for n in dont_ban if n in desc.positions)],
        "recompute_views": ctx.recompute_views,
        "parameters_are_free": ctx.treat_params_as_free,
    }


def cut_fx_graph(joint_graph: fx.Graph, ctx: PolicyContext, dont_ban: set[fx.Node] | None,
                 memo: NetworkMemo | None, solver: str
                 ) -> tuple[list[fx.Node], dict[fx.Node, str], CorePartition]:
    """(saved values in graph order, bans, the core's answer) of one min cut."""
    memo = memo if memo is not None else NetworkMemo()
    desc = memo.description(joint_graph, ctx)
    result = partition(desc.graph, solver=solver, **core_options(desc, ctx, dont_ban or ()))
    nodes = desc.nodes
    banned = {nodes[i]: why for i, why in result.banned_at.items()}
    if log.isEnabledFor(logging.DEBUG):
        for node, reason in banned.items():
            log.debug("banned from recomputation: %s (%s)", node.name, reason)
    saved = [nodes[i] for i in result.saved_indices.tolist()]
    return saved, banned, result


def fx_graph_bans(joint_graph: fx.Graph, ctx: PolicyContext, dont_ban: set[fx.Node] | None,
                  memo: NetworkMemo | None) -> dict[fx.Node, str]:
    """The bans ``cut_fx_graph`` makes under the same arguments (node -> reason, in its
    order), without the cut."""
    memo = memo if memo is not None else NetworkMemo()
    desc = memo.description(joint_graph, ctx)
    options = core_options(desc, ctx, dont_ban or ())
    found = ban_reasons(desc.graph, release=options["release"], rules=options["rules"],
                        max_dist_from_bw=options["max_dist_from_bw"])
    return {desc.nodes[i]: why for i, why in found.items()}


@dataclass(frozen=True)
class CoreCall:
    """One cut as plain data: the core graph and the ``core.partition`` options to cut it
    with; ``partition()`` gives what the fx path decides (saved set, bans, reasons)."""

    graph: CoreGraph
    options: dict[str, Any]

    def partition(self, solver: str = "scipy") -> CorePartition:
        return partition(self.graph, solver=solver, **self.options)


def core_call(joint_graph: fx.Graph, ctx: PolicyContext,
              dont_ban: Collection[fx.Node] = ()) -> CoreCall:
    """The core graph and options of one cut of a classified joint under ``ctx``."""
    desc = describe(joint_graph, ctx)
    return CoreCall(desc.graph, core_options(desc, ctx, dont_ban))


def core_graph_of(joint_module: fx.GraphModule, num_fwd_outputs: int, *,
                  options: MinCutOptions | None = None, config: PartitionConfig | None = None,
                  static_lifetime_input_indices: Collection[int] | None = None) -> CoreCall:
    """A joint graph module (as a partitioner receives it) in core terms: classified and
    described as the min-cut partitioner does, with the options of its first cut (default:
    ``config.options``; ``config`` defaults to the flags). The joint is prepared
    (``prepare.prepared_joint``) and restored around the description; the graph's ids are the
    fx node names. Returns the graph and the ``core.partition`` options of that cut."""
    config = config if config is not None else PartitionConfig.from_flags()
    options = options if options is not None else config.options
    with prepared_joint(joint_module, num_fwd_outputs, config=config):
        info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
        ctx = PolicyContext.create(default_op_types(), info, options, config)
        return core_call(joint_module.graph, ctx)


def fx_core_graph(joint_graph: fx.Graph, ctx: PolicyContext,
                  dont_ban: Collection[fx.Node] = ()) -> CoreGraph:
    """A self-contained core description of one cut: ``describe`` with the cut's bans (the
    rules' included) written into the nodes, so ``core.partition`` with no rules cuts it."""
    call = core_call(joint_graph, ctx, dont_ban)
    banned = call.partition().banned
    released = set(call.options["release"])
    nodes = [replace(c, ban=banned.get(c.id),
                     allow_recompute=c.allow_recompute or c.id in released)
             for c in call.graph.nodes]
    return CoreGraph(tuple(nodes))
