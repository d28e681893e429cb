"""Reorder the backward like the autograd engine runs it.

Extraction leaves recomputed forward ops where they sat in the joint graph, i.e. all before
the backward proper, so their results would stay alive for the whole backward. This pass walks
the backward from its first tangent user and places each op right after pulling in only the
recomputed ops it needs, which keeps recomputed values short-lived.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from ..joint import is_tangent


def _is_placeholder(node: fx.Node) -> bool:
    return node.op == "placeholder"


def _backward_order(nodes: list[fx.Node],
                    is_input: Callable[[fx.Node], bool] = _is_placeholder
                    ) -> list[fx.Node] | None:
    """The new node order (placeholders first), or None when nothing reads the tangents.

    Nodes before the first tangent user that nothing after it needs are left out.
    ``is_input``: which nodes are the graph's inputs (default: its placeholders; a plan of
    joint nodes names its own, memory.simulate_plan). Users outside ``nodes`` are ignored.
    """
    order = {node: i for i, node in enumerate(nodes)}
    first_bw = min((user for t in nodes if is_tangent(t) for user in t.users if user in order),
                   key=order.__getitem__, default=None)
    if first_bw is None:
        return None
    placed: set[fx.Node] = set()
    new_order: list[fx.Node] = []
    for node in nodes:
        if is_input(node):
            placed.add(node)
            new_order.append(node)

    def place_with_dependencies(node: fx.Node) -> None:
        needed: set[fx.Node] = set()
        stack = [node]
        while stack:
            cur = stack.pop()
            if cur in needed or cur in placed:
                continue
            needed.add(cur)
            stack.extend(cur._input_nodes)
        placed.update(needed)
        new_order.extend(sorted(needed, key=order.__getitem__))

    start = order[first_bw]
    # In-place copies (input mutations) may not read the tangents; keep them.
    for node in nodes[:start]:
        if (node.op == "call_function" and node.target is torch.ops.aten.copy_.default
                and not is_input(node)):
            place_with_dependencies(node)
    for node in nodes[start:]:
        if node not in placed and placed.issuperset(node._input_nodes):
            placed.add(node)  # the usual case: its inputs are in place, it needs nothing else
            new_order.append(node)
        else:
            place_with_dependencies(node)
    return _getitems_after_their_tuple(new_order, is_input)


def _getitems_after_their_tuple(new_order: list[fx.Node],
                                is_input: Callable[[fx.Node], bool] = _is_placeholder
                                ) -> list[fx.Node]:
    """``new_order`` with each ``getitem`` moved up to right after the node whose tuple it
    reads. A recomputed multi-output op (``native_layer_norm``) may have one output read at
    once and the others only much later; until its last ``getitem`` runs, the tuple holds
    every output alive (in the generated code, and in memory_models/simulator.py's model), so taking them all
    at once frees an output after its own last use. A ``getitem`` allocates nothing."""
    kept = set(new_order)
    getitems = {node: [u for u in node.users if u.target is operator.getitem and u in kept
                       and not is_input(u)]
                for node in new_order
                if node.op == "call_function" and not is_input(node)
                and any(u.target is operator.getitem for u in node.users)}
    if not getitems:
        return new_order
    moved = {g for found in getitems.values() for g in found}
    result: list[fx.Node] = []
    for node in new_order:
        if node in moved:
            continue
        result.append(node)
        result.extend(getitems.get(node, ()))
    return result


def reorder_backward(graph: fx.Graph) -> bool:
    """Reorder ``graph`` in place (moving nodes, no copies); True if it was reordered.

    Nodes that nothing after the first tangent user needs are erased. Cheaper than building
    a new graph: the caller wraps the graph in a GraphModule (or recompiles) once.
    """
    nodes = list(graph.nodes)
    new_order = _backward_order(nodes)
    if new_order is None:  # gradients independent of the tangents: nothing to reorder
        return False
    kept = set(new_order)
    # A dropped node's users are all dropped too (any kept user would have pulled it in),
    # so erasing in reverse graph order never erases a node that still has users.
    for node in reversed(nodes):
        if node not in kept:
            graph.erase_node(node)
    cursor = graph._root
    for node in new_order:
        if cursor.next is not node:
            cursor.append(node)
        cursor = node
    return True

