"""Cut the joint graph into forward and backward GraphModules once the saved values are known.

Also the default split's choice of saved values (``default_saved_values``: every forward value
the backward reads), which both partitioners use.

Output convention of AOTAutograd's runtime wrappers (2.11 to 2.15): the forward returns
``user outputs + saved tensors + saved opaque objects + saved symbolic scalars``; the backward
takes ``saved symbolic scalars + saved tensors + saved opaque objects + tangents + backward
seeds + backward state`` (``saved_in_runtime_order``).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node
from torch.fx.experimental.symbolic_shapes import (
    find_symbol_binding_fx_nodes,
    free_symbols,
    is_symbol_binding_fx_node,
)

from ._compat import saved_output_descs
from .graph_modules import make_graph_module
from .joint import (
    PLAIN_LEAVES,
    check_topological_order,
    computable_from,
    forward_and_backward_outputs,
    is_backward_state,
    is_bwd_seed_offset,
    is_fwd_seed_offset,
    is_merged_duplicate,
    is_primal,
    is_tangent,
)
from .passes.dce import treats_random_as_impure
from .sizes import is_opaque, is_opaque_value


def extract_subgraph(joint_graph: fx.Graph, inputs: Sequence[fx.Node], outputs: Sequence[Any],
                     output_descs: Sequence[Any] | None = None, *,
                     needed: set[fx.Node] | None = None) -> fx.Graph:
    """The part of ``joint_graph`` computing ``outputs`` from ``inputs`` (any nodes may be inputs).

    Only the nodes dead-code elimination would keep are copied (copying is the costly part):
    ancestors of the outputs and side-effecting nodes, all computable from the inputs.
    ``needed``: that set, if the caller already has it for these inputs and outputs.
    """
    if needed is None:
        needed = _needed_nodes(joint_graph, inputs, outputs)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        placeholder = _placeholder(graph, node.name)
        # An fx node can become a placeholder: no node_copy. The meta is shared, as torch
        # shares it; object.__setattr__ skips Node.__setattr__'s find-nodes table update,
        # which the meta does not key (see _copy_node).
        object.__setattr__(placeholder, "meta", node.meta)
        env[node] = placeholder
    for node in joint_graph.nodes:
        if node in needed and node not in env:
            env[node] = _copy_node(graph, node, env)
    values = []
    for out in outputs:
        if isinstance(out, fx.Node):
            if out not in env:
                raise AssertionError(
                    f"output '{out.name}' cannot be computed from the inputs "
                    f"{[n.name for n in inputs]}"
                )
            values.append(env[out])
        else:
            values.append(out)
    output = graph.output(tuple(values))
    if output_descs is not None and all(d is not None for d in output_descs):
        output.meta["desc"] = list(output_descs)
    return graph


def _placeholder(graph: fx.Graph, name: str) -> fx.Node:
    """``graph.placeholder(name)``. That derives the node's name from ``name`` by snake-casing
    it (magic names lose their underscores), which leaves a lower-case name as it is: such a
    name is handed over directly (AOTAutograd's ``primals_1``, ``tangents_1``)."""
    if name.islower() and not (name.startswith("__") and name.endswith("__")):
        return graph.create_node("placeholder", name, name=name)
    return graph.placeholder(name)


def _copy_node(graph: fx.Graph, node: fx.Node, env: dict[fx.Node, fx.Node]) -> fx.Node:
    """``graph.node_copy(node, env.__getitem__)``, with less overhead per node.

    node_copy passes the arguments to ``create_node``, which (torch 2.13) walks them with
    pytree looking for raw symbolic values, which a traced joint's nodes never hold; then
    sets ``meta`` through ``Node.__setattr__``, which takes the node out of the graph's
    find-nodes table and puts it back. Here the node is created bare and its arguments and
    meta set with ``object.__setattr__`` (the ``args``/``kwargs`` property setters still run
    and register the node with its inputs; it is their last user, as with node_copy).
    Neither touches the table's key (op, target) nor the node's place in it.
    """
    args = _map_args(node.args, env)
    kwargs = node.kwargs
    copied = graph.create_node(node.op, node.target, (), None, node.name, node.type)
    if args:
        object.__setattr__(copied, "args", args)
    if kwargs:
        object.__setattr__(copied, "kwargs", fx.map_arg(kwargs, env.__getitem__))
    meta = node.meta
    object.__setattr__(copied, "meta", meta.copy() if type(meta) is dict else copy.copy(meta))
    return copied


def _map_args(args: tuple[Any, ...], env: dict[fx.Node, fx.Node]) -> tuple[Any, ...]:
    """``fx.map_arg(args, env.__getitem__)`` for a node's args tuple, with the usual flat
    case (nodes and plain scalars) done inline; anything else goes through map_arg."""
    mapped = []
    for value in args:
        kind = type(value)
        if kind is fx.Node:
            mapped.append(env[value])
        elif kind in PLAIN_LEAVES:
            mapped.append(value)
        else:
            return fx.map_arg(args, env.__getitem__)
    return tuple(mapped)


def _live_nodes(computable: set[fx.Node], inputs: Iterable[fx.Node],
                outputs: Iterable[Any], impure_allowed: set[fx.Node] | None = None
                ) -> set[fx.Node]:
    """What fx's dead-code elimination keeps of ``computable``: the impure nodes (judged as
    it judges them; only those in ``impure_allowed`` if given) and everything the outputs
    or those nodes read."""
    live: set[fx.Node] = set()
    input_set = set(inputs)

    def mark(roots: Iterable[fx.Node]) -> None:
        stack = [r for r in roots if r in computable and r not in live]
        while stack:
            node = stack.pop()
            if node in live:
                continue
            live.add(node)
            if node not in input_set:  # what an input was computed from is not needed
                stack.extend(node._input_nodes)

    mark(o for o in outputs if isinstance(o, fx.Node))
    impure_random = treats_random_as_impure()
    by_op: dict[Any, bool] = {}
    mark(n for n in computable - live
         if n not in input_set and (impure_allowed is None or n in impure_allowed)
         and _is_impure(n, impure_random, by_op) and not is_merged_duplicate(n))
    return live


def _is_impure(node: fx.Node, impure_random: bool, by_op: dict[Any, bool]) -> bool:
    """``node.is_impure(impure_random)``, asked once per op of an ``OpOverload`` call: its
    answer depends on the op alone (its schema, the effect and side-effect registries; torch
    2.11 to 2.15), not on the call's arguments."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return node.is_impure(impure_random)
    known = by_op.get(target)
    if known is None:
        known = by_op[target] = node.is_impure(impure_random)
    return known


def _computable_downstream_of_backward_inputs(joint_graph: fx.Graph, inputs: Sequence[fx.Node]
                                              ) -> tuple[set[fx.Node], set[fx.Node]]:
    """(``computable_from(joint_graph, inputs)``, the nodes of it that read a tangent or a
    backward seed, directly or not), in one walk of the graph."""
    computable = set(inputs)
    region = {n for n in computable if is_tangent(n) or is_bwd_seed_offset(n)}
    for node in joint_graph.nodes:
        read = node._input_nodes
        if node not in computable:
            if node.op in ("placeholder", "output") or not computable.issuperset(read):
                continue
            computable.add(node)
        if not region.isdisjoint(read):
            region.add(node)
    return computable, region


def _needed_nodes(joint_graph: fx.Graph, inputs: Sequence[fx.Node],
                  outputs: Iterable[Any], *, backward: bool = False) -> set[fx.Node]:
    """What extract_subgraph copies: the live nodes computable from ``inputs``.

    ``backward``: side effects of the forward (a ``copy_`` into a buffer, an assert) stay in
    the forward even when the backward could compute them from what it recomputes (running
    a batch norm's stat update twice would be wrong); the backward keeps only the impure
    nodes that read a tangent or a backward seed.
    """
    if backward:
        computable, allowed = _computable_downstream_of_backward_inputs(joint_graph, inputs)
        return _live_nodes(computable, inputs, outputs, allowed)
    return _live_nodes(computable_from(joint_graph, inputs), inputs, outputs)


def backward_live_nodes(joint_graph: fx.Graph, inputs: Sequence[fx.Node],
                        outputs: Iterable[Any]) -> set[fx.Node]:
    """The nodes a backward with ``inputs`` (saved values, tangents, seeds) computing
    ``outputs`` would hold: the inputs it reads and everything it computes, as extracted."""
    return _needed_nodes(joint_graph, inputs, outputs, backward=True)


def _bind_symbols(joint_graph: fx.Graph, saved_sym_nodes: list[fx.Node],
                  saved_values: list[fx.Node], tangents: list[fx.Node]) -> list[fx.Node]:
    """Saved symbolic scalars, with binding nodes for every symbol the backward inputs use.

    Downstream size-variable assignment needs each free symbol of a backward input bound
    by a plain-symbol input; bindings come first, derived expressions after.
    """
    saved_symbols: set[Any] = set()
    binding: list[fx.Node] = []
    derived: list[fx.Node] = []
    for node in saved_sym_nodes:
        symbol = is_symbol_binding_fx_node(node)
        if symbol:
            saved_symbols.add(symbol)
            binding.append(node)
        else:
            derived.append(node)
    bindings: dict[Any, fx.Node] | None = None  # a whole-graph scan: only when needed
    for node in [*derived, *saved_values, *tangents]:
        val = node.meta.get("val")
        if val is None or is_opaque_value(val) or (isinstance(val, torch.Tensor)
                                                   and not val._has_symbolic_sizes_strides):
            continue  # static shapes (the usual case): no symbol, and free_symbols is slow
        new_symbols = free_symbols(val) - saved_symbols
        if not new_symbols:
            continue
        if bindings is None:
            bindings = find_symbol_binding_fx_nodes(joint_graph)
        for symbol in sorted(new_symbols, key=lambda s: s.name):
            if symbol in bindings:  # ill-formed graphs (direct make_fx) may lack one
                binding.append(bindings[symbol])
        saved_symbols |= new_symbols
    return list(dict.fromkeys(binding + derived))


def extract_forward_backward(
    joint_module: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    lazy_modules: bool,
) -> tuple[fx.GraphModule, fx.GraphModule, list[fx.Node], list[fx.Node]]:
    """(forward, backward, final saved tensors, final saved symbolic scalars).

    Saved values the backward never reads are dropped; backward state goes straight to the
    backward; tensors flagged ``saved_tensor_with_no_vc_check`` follow the others, opaque
    objects come last (``saved_in_runtime_order``).
    ``lazy_modules``: the modules generate their code on first use (graph_modules.py).
    """
    fw_graph, bw_graph, saved_values, saved_sym_nodes = extract_forward_backward_graphs(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
    return (make_graph_module(joint_module, fw_graph, code_on_first_use=lazy_modules),
            make_graph_module(joint_module, bw_graph, code_on_first_use=lazy_modules),
            saved_values, saved_sym_nodes)


@dataclass(frozen=True)
class CutPlan:
    """What a cut's two graphs hold, before any node is copied: their inputs (the graphs'
    placeholders, in order), outputs, and the joint nodes each computes (``extract_subgraph``
    copies exactly these, in joint order, the inputs excepted). A memory simulation of the cut
    can run on it without the copies (memory.simulate_plan)."""

    fw_inputs: list[fx.Node]
    fw_outputs: list[Any]
    fw_descs: list[Any] | None
    fw_needed: set[fx.Node]
    bw_inputs: list[fx.Node]
    bw_outputs: list[Any]
    bw_descs: list[Any]
    bw_needed: set[fx.Node]
    saved_values: list[fx.Node]
    saved_sym_nodes: list[fx.Node]

    def fw_nodes(self, joint_graph: fx.Graph) -> list[fx.Node]:
        """The forward's computed nodes in joint order (its placeholders excepted)."""
        return _computed_in_order(joint_graph, self.fw_needed, self.fw_inputs)

    def bw_nodes(self, joint_graph: fx.Graph) -> list[fx.Node]:
        """The backward's computed nodes in joint order, before any reordering."""
        return _computed_in_order(joint_graph, self.bw_needed, self.bw_inputs)


def _computed_in_order(joint_graph: fx.Graph, needed: set[fx.Node],
                       inputs: Sequence[fx.Node]) -> list[fx.Node]:
    placeholders = set(inputs)
    return [n for n in joint_graph.nodes if n in needed and n not in placeholders]


def plan_cut(
    joint_module: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    known_live: Mapping[frozenset[fx.Node], set[fx.Node]] | None = None,
) -> CutPlan:
    """The cut's plan (``extract_forward_backward_graphs`` builds its graphs from it)."""
    graph = joint_module.graph
    fw_outputs, bw_outputs, fw_descs, bw_descs = forward_and_backward_outputs(
        joint_module, num_fwd_outputs)
    placeholders = list(graph.find_nodes(op="placeholder"))
    primals = [n for n in placeholders if is_primal(n)]
    tangents = [n for n in placeholders if is_tangent(n)]
    fwd_seeds = [n for n in placeholders if is_fwd_seed_offset(n)]
    bwd_seeds = [n for n in placeholders if is_bwd_seed_offset(n)]
    backward_state = [n for n in placeholders if is_backward_state(n)]

    # Opaque inputs (a DTensor's DeviceMesh) cost nothing and cannot be recomputed: whatever
    # the cut chose, the backward gets each one it reads (the unread ones are dropped below).
    chosen = set(saved_values)
    saved_values = saved_values + [n for n in primals if n not in chosen and is_opaque(n)]
    candidate_inputs = saved_sym_nodes + saved_values + tangents + bwd_seeds
    candidate_live = (known_live or {}).get(frozenset(candidate_inputs))
    if candidate_live is None:
        candidate_live = _needed_nodes(graph, candidate_inputs, bw_outputs, backward=True)
    used = {n for n in candidate_inputs if n in candidate_live}
    saved_values = [n for n in saved_values if n in used and not is_backward_state(n)]
    saved_sym_nodes = [n for n in saved_sym_nodes if n in used]
    saved_sym_nodes = _bind_symbols(graph, saved_sym_nodes, saved_values, tangents)
    saved_values = saved_in_runtime_order(saved_values)

    num_saved = len(saved_values) + len(saved_sym_nodes)
    saved_descs = saved_output_descs(num_saved)
    fw_inputs = primals + fwd_seeds
    fw_all_outputs = fw_outputs + saved_values + saved_sym_nodes
    bw_inputs = saved_sym_nodes + saved_values + tangents + bwd_seeds + backward_state
    bw_live = (candidate_live if _same_live_set(candidate_inputs, bw_inputs, candidate_live)
               else _needed_nodes(graph, bw_inputs, bw_outputs, backward=True))
    return CutPlan(
        fw_inputs=fw_inputs, fw_outputs=fw_all_outputs,
        fw_descs=None if saved_descs is None else fw_descs + saved_descs,
        fw_needed=_needed_nodes(graph, fw_inputs, fw_all_outputs),
        bw_inputs=bw_inputs, bw_outputs=bw_outputs, bw_descs=bw_descs, bw_needed=bw_live,
        saved_values=saved_values, saved_sym_nodes=saved_sym_nodes)


def extract_forward_backward_graphs(
    joint_module: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    known_live: Mapping[frozenset[fx.Node], set[fx.Node]] | None = None,
    plan: CutPlan | None = None,
) -> tuple[fx.Graph, fx.Graph, list[fx.Node], list[fx.Node]]:
    """Like extract_forward_backward, with bare graphs: passes can still edit them before
    they are wrapped (building a GraphModule generates and compiles code, so do it once).
    ``known_live``: backward live sets (``backward_live_nodes``) already found for this
    joint, by input set; the one of this cut's backward inputs is not found again. ``plan``:
    this cut's plan (``plan_cut``), if the caller made it already."""
    if plan is None:
        plan = plan_cut(joint_module, saved_values, saved_sym_nodes,
                        num_fwd_outputs=num_fwd_outputs, known_live=known_live)
    graph = joint_module.graph
    fw_graph = extract_subgraph(graph, plan.fw_inputs, plan.fw_outputs, plan.fw_descs,
                                needed=plan.fw_needed)
    bw_graph = extract_subgraph(graph, plan.bw_inputs, plan.bw_outputs, plan.bw_descs,
                                needed=plan.bw_needed)
    for node in bw_graph.nodes:
        if node.op in ("call_function", "get_attr"):
            node.meta["autograd_backward"] = True
    return fw_graph, bw_graph, list(plan.saved_values), list(plan.saved_sym_nodes)


def _same_live_set(inputs: Sequence[fx.Node], kept: Sequence[fx.Node],
                   live: set[fx.Node]) -> bool:
    """Whether ``live``, the backward live set from ``inputs``, is also the one from ``kept``:
    when ``kept`` adds no input and drops only inputs ``live`` does not hold. Every ancestor of
    a live node, up to the inputs, is live, so a dead input feeds nothing live and dropping it
    changes nothing (budget 0 lists every input; the backward reads a few)."""
    kept_set = set(kept)
    return kept_set.issubset(inputs) and not any(
        n in live for n in inputs if n not in kept_set)


def saved_in_runtime_order(saved_values: list[fx.Node]) -> list[fx.Node]:
    """Saved values in the groups AOTAutograd's runtime slices the forward's outputs into:
    tensors it checks the version counter of, tensors flagged ``saved_tensor_with_no_vc_check``,
    then opaque objects (``DeviceMesh``, script objects: stashed on ctx, never saved as
    tensors). Each group keeps its order; the symbolic scalars follow all three."""
    opaque = [n for n in saved_values if is_opaque(n)]
    tensors = [n for n in saved_values if not is_opaque(n)]
    return ([n for n in tensors if not n.meta.get("saved_tensor_with_no_vc_check")]
            + [n for n in tensors if n.meta.get("saved_tensor_with_no_vc_check")] + opaque)


def is_assert_only_symbool(node: fx.Node) -> bool:
    """A SymBool read only by ``_assert_scalar``: the forward checks it, nobody saves it."""
    return (isinstance(node.meta.get("val"), torch.SymBool) and len(node.users) > 0
            and all(u.target is torch.ops.aten._assert_scalar.default for u in node.users))


def default_saved_values(joint_module: fx.GraphModule, num_fwd_outputs: int
                         ) -> tuple[list[fx.Node], list[fx.Node]]:
    """(saved tensors, saved symbolic scalars) of the default split, like the original
    ``.forward()``/``.backward()``: every forward value the backward reads.

    The forward holds every op between the forward inputs and the forward outputs; of its
    values, the backward's inputs are saved (only sizes, when the backward needs only those).
    """
    graph = joint_module.graph
    check_topological_order(graph)
    inputs = [n for n in graph.nodes if is_primal(n) or is_fwd_seed_offset(n)]
    fw_outputs, _, _, _ = forward_and_backward_outputs(joint_module, num_fwd_outputs)
    forward_only = extract_subgraph(graph, inputs, fw_outputs)
    forward_names = {n.name for n in forward_only.nodes if n.op != "output"}
    saved_values: list[fx.Node] = []
    saved_sym_nodes: list[fx.Node] = []
    for node in graph.nodes:
        if node.name not in forward_names:
            continue
        if is_sym_node(node):
            # Symbolic scalars are kept apart: autograd stashes them on ctx, not via save.
            saved_sym_nodes.append(node)
        elif node.users and all(u.target is operator.getitem for u in node.users):
            # A tuple cannot be saved: save its items (dead-code elimination of the forward
            # may have dropped the ones only the backward reads).
            saved_values.extend(node.users)
        else:
            backward_uses = [u for u in node.users if u.name not in forward_names]
            if backward_uses and all(is_sym_node(u) for u in backward_uses):
                # The backward needs only sizes: save those, not the tensor.
                saved_sym_nodes.extend(backward_uses)
            elif backward_uses:
                saved_values.append(node)
    saved_values = list(dict.fromkeys(saved_values))
    saved_sym_nodes = [n for n in dict.fromkeys(saved_sym_nodes) if not is_assert_only_symbool(n)]
    return saved_values, saved_sym_nodes
