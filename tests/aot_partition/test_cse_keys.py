"""CSE keys a node in full only once a second node calls its target on the same inputs.

``merge_common_subexpressions`` groups nodes by (target, input nodes after merging) first and
freezes arguments only within a group (most nodes are alone in theirs). These graphs pin the
cases where that grouping could differ from comparing every node's full key: a node whose
inputs merge into one, scalars that only differ in type, a third node matching the first after
a second did not, and a mutation between two equal reads. Each is compared with torch's own
CSE (``fx_graph_cse``) on the same graph, and with the nodes expected to survive.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from aot_partition.fx.passes import eliminate_common_subexpressions
from torch._functorch.compile_utils import fx_graph_cse

aten = torch.ops.aten


def _graph(build) -> fx.Graph:
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    graph.output(build(graph, x, y))
    return graph


def _calls(graph: fx.Graph) -> list[str]:
    """The call_function nodes left, as ``target(args)`` with nodes by name."""
    def show(a):
        return a.name if isinstance(a, fx.Node) else repr(a)
    return [f"{n.target}({', '.join(show(a) for a in n.args)})"
            for n in graph.nodes if n.op == "call_function"]


def _ours(build) -> list[str]:
    graph = _graph(build)
    eliminate_common_subexpressions(graph)
    graph.lint()
    return _calls(graph)


def _torchs(build) -> list[str]:
    return _calls(fx_graph_cse(_graph(build)))


def _inputs_merging_into_one(g, x, y):
    a = g.call_function(aten.add.Tensor, (x, 1))
    b = g.call_function(aten.add.Tensor, (x, 1))      # merges into a
    c = g.call_function(aten.mul.Tensor, (a, b))      # reads (a, a) once b is merged
    d = g.call_function(aten.mul.Tensor, (a, a))      # equal to c: merges
    return (c, d)


def test_a_node_whose_two_inputs_merge_into_one_merges_with_a_node_reading_that_one_twice():
    ours = _ours(_inputs_merging_into_one)
    assert ours == ["aten.add.Tensor(x, 1)", "aten.mul.Tensor(add_tensor, add_tensor)"]
    assert ours == _torchs(_inputs_merging_into_one)


def _scalars_of_other_types(g, x, y):
    first = g.call_function(aten.add.Tensor, (x, 1))
    as_float = g.call_function(aten.add.Tensor, (x, 1.0))
    as_bool = g.call_function(aten.add.Tensor, (x, True))
    other = g.call_function(aten.add.Tensor, (x, 2))
    again = g.call_function(aten.add.Tensor, (x, 1))   # the first's twin, after three others
    return (first, as_float, as_bool, other, again)


def test_same_inputs_with_scalars_of_another_type_or_value_stay_apart_and_a_later_twin_merges():
    ours = _ours(_scalars_of_other_types)
    assert ours == ["aten.add.Tensor(x, 1)", "aten.add.Tensor(x, 1.0)",
                    "aten.add.Tensor(x, True)", "aten.add.Tensor(x, 2)"]


def _twins_around_a_mutation(g, x, y):
    before = g.call_function(aten.mul.Tensor, (x, 3))
    g.call_function(aten.copy_.default, (x, y))
    after = g.call_function(aten.mul.Tensor, (x, 3))   # reads x's new contents: kept
    again = g.call_function(aten.mul.Tensor, (x, 3))   # the same epoch as ``after``: merges
    return (before, after, again)


def test_equal_reads_on_both_sides_of_a_mutation_stay_apart_and_merge_within_one_side():
    assert _ours(_twins_around_a_mutation) == [
        "aten.mul.Tensor(x, 3)", "aten.copy_.default(x, y)", "aten.mul.Tensor(x, 3)"]


def _list_arguments(g, x, y):
    a = g.call_function(aten.view.default, (x, [2, 3]))
    b = g.call_function(aten.view.default, (x, [3, 2]))   # same inputs, another shape
    c = g.call_function(aten.view.default, (x, [2, 3]))   # a's twin
    item = g.call_function(operator.getitem, ((a, b, c), 0))
    return (a, b, c, item)


def test_list_arguments_are_compared_by_value_within_a_group():
    ours = _ours(_list_arguments)
    assert ours == ["aten.view.default(x, [2, 3])", "aten.view.default(x, [3, 2])",
                    "<built-in function getitem>((view_default, view_default_1, view_default), 0)"]
    assert ours == _torchs(_list_arguments)
