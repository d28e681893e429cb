"""The partitioner's fast paths give what the plain ways give (issue 41, item 7).

Each fast path below replaced a per-node loop or a per-node hash: the fx description hands the
core its input positions, save costs are computed for all nodes at once, CSE looks targets up by
id, and a node with one forward user skips the "used far apart" search. Each test compares the
fast path with the way it replaced, on graphs where they could differ.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch.fx as fx
from aot_partition.core import CoreGraph, CoreGraphError, CoreNode, default_save_costs
from aot_partition.core.rules import (
    FAR,
    ban_used_far_apart,
    distances_from_backward,
    fusion,
    use_distances,
)
from aot_partition.fx.passes.cse import merge_common_subexpressions
from core_graphs import mlp


def fw(node_id, inputs=(), category="pointwise", nbytes=64, **fields):
    return CoreNode(node_id, tuple(inputs), nbytes=nbytes, category=category, forward=True,
                    **fields)


def bw(node_id, inputs=(), category="pointwise", nbytes=64, **fields):
    return CoreNode(node_id, tuple(inputs), nbytes=nbytes, category=category, in_backward=True,
                    **fields)


def test_graph_with_input_positions_is_the_graph_by_ids():
    nodes = mlp().nodes
    index = {n.id: i for i, n in enumerate(nodes)}
    positions = [[index[i] for i in n.inputs] for n in nodes]
    fast = CoreGraph.with_input_positions(nodes, positions)
    plain = CoreGraph(nodes)
    assert fast == plain
    assert fast.input_indices == plain.input_indices and fast.users == plain.users
    assert fast.index == plain.index


def test_graph_with_input_positions_checks_what_the_constructor_checks():
    nodes = (fw("x", category="input"), bw("g", (), "tangent"), fw("late", ("g",)))
    with pytest.raises(CoreGraphError) as by_ids:
        CoreGraph(nodes)
    with pytest.raises(CoreGraphError) as by_positions:
        CoreGraph.with_input_positions(nodes, [[], [], [1]])
    assert str(by_positions.value) == str(by_ids.value)
    assert "reads 'g', a backward value" in str(by_ids.value)


def _save_costs_one_by_one(graph, recompute_views, parameters_are_free):
    """default_save_costs as it was written: one node at a time."""
    fusible, concat = fusion(graph)
    dist = distances_from_backward(graph)
    costs = []
    for i, node in enumerate(graph.nodes):
        if node.save_cost is not None:
            costs.append(node.save_cost)
        elif (not node.saveable or node.category == "opaque"
              or (recompute_views and node.category == "view")):
            costs.append(math.inf)
        elif node.category == "parameter" and parameters_are_free:
            costs.append(0.0)
        elif node.category == "symbolic":
            costs.append(node.nbytes)
        else:
            hops = max(min(int(dist[i]), 100), 1)
            cost = int(node.nbytes * (1.1 ** hops))
            users = graph.users[i]
            materialized = (node.category in ("input", "parameter", "seed", "tangent")
                            or node.output
                            or not all(concat[u] or (fusible[i] and fusible[u]) for u in users))
            costs.append(cost if materialized else cost * 2)
    return costs


def _chain_graph(length, nbytes):
    """x -> p0 -> ... (fusible pointwise, views, a concat, a matmul) -> a backward reading the
    last node and some early ones: distances from 1 to past the cap, fused and unfused uses."""
    nodes = [fw("x", category="input", nbytes=nbytes)]
    categories = ["pointwise", "view", "pointwise", "compute", "concat", "reduction"]
    for i in range(length):
        previous = nodes[-1].id
        category = categories[i % len(categories)]
        nodes.append(fw(f"p{i}", (previous,), category, nbytes=nbytes + 3 * i,
                        save_cost=7.0 if i == 5 else None, saveable=i != 7))
    nodes.append(fw("sym", ("x",), "symbolic", nbytes=1))
    nodes.append(fw("w", category="parameter", nbytes=nbytes))
    nodes.append(bw("g", (), "tangent"))
    nodes.append(bw("g_last", ("g", nodes[length].id, "p1", "sym", "w"), "compute"))
    return CoreGraph(tuple(nodes))


@pytest.mark.parametrize("length, nbytes", [(12, 64), (130, 2**40 + 7), (130, 3)])
@pytest.mark.parametrize("recompute_views", [False, True])
@pytest.mark.parametrize("parameters_are_free", [False, True])
def test_save_costs_at_once_are_the_costs_one_by_one(length, nbytes, recompute_views,
                                                      parameters_are_free):
    graph = _chain_graph(length, nbytes)
    assert int(distances_from_backward(graph).max()) > 100 or length < 100
    costs = default_save_costs(graph, recompute_views=recompute_views,
                               parameters_are_free=parameters_are_free)
    expected = _save_costs_one_by_one(graph, recompute_views, parameters_are_free)
    assert costs.tolist() == expected  # exactly: the same float products and truncations
    assert any(c == 2 * int(n.nbytes * 1.1) for c, n in zip(expected, graph.nodes)), (
        "a node priced as unmaterialized (doubled)")


def test_save_costs_use_the_front_ends_distances():
    graph = _chain_graph(12, 64)
    far = np.full(len(graph.nodes), 150)
    use_distances(graph, far)
    costs = default_save_costs(graph, recompute_views=False, parameters_are_free=True)
    assert costs.tolist() == _save_costs_one_by_one(graph, False, True)
    assert costs[graph.index["p0"]] == 2 * int((64 + 0) * 1.1 ** 100)
    assert int(distances_from_backward(graph)[0]) == 150 < FAR


def _used_far_apart_everywhere(graph):
    banned: dict[int, str] = {}
    ban_used_far_apart(graph, banned, np.ones(len(graph.nodes), dtype=bool))
    return banned


def test_used_far_apart_bans_a_late_user_and_never_a_lone_user():
    # a is read by the matmul mm, whose user m2 cannot fuse it, and later by late (fusible):
    # late is banned. Every other forward value has one forward user: never banned.
    graph = CoreGraph((
        fw("x", category="input"), fw("w", category="parameter"),
        fw("a", ("x",)), fw("mm", ("a", "w"), "compute"), fw("m2", ("mm",)),
        fw("late", ("a",)), fw("c", ("late",)), fw("d", ("c", "m2")),
        bw("g", (), "tangent"), bw("gd", ("g", "d"), "compute", backward=True)))
    banned = {graph.nodes[i].id: why for i, why in _used_far_apart_everywhere(graph).items()}
    assert banned == {"late": "used far apart: a is used before and after an unfusible op"}


def _cse_graph(first_target, second_target):
    graph = fx.Graph()
    x = graph.placeholder("x")
    one = graph.call_function(first_target, (x, 1))
    two = graph.call_function(second_target, (x, 1))
    graph.output((one, two))
    return graph, one, two


class _EqualByName:
    """A callable target equal to another of the same name (two objects, one op)."""

    def __init__(self, name):
        self.name = self.__name__ = name

    def __call__(self, *args):
        return args[0]

    def __eq__(self, other):
        return isinstance(other, _EqualByName) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


def test_cse_merges_equal_targets_that_are_distinct_objects():
    graph, one, two = _cse_graph(_EqualByName("f"), _EqualByName("f"))
    merged = merge_common_subexpressions(graph)
    assert merged.duplicates == [two]
    merged.undo()
    assert list(one.users) == list(two.users) == [next(iter(graph.find_nodes(op="output")))]
    graph, one, two = _cse_graph(_EqualByName("f"), _EqualByName("g"))
    assert merge_common_subexpressions(graph).duplicates == []
