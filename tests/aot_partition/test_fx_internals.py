"""The torch.fx internals aot_partition reads for speed, checked on the torch release under test."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx


def test_input_nodes_is_all_input_nodes_without_the_copy():
    # The graph walks iterate ``node._input_nodes`` (joint.py's module doc): it must hold the
    # same nodes in the same order as ``all_input_nodes``, args before kwargs, each once.
    graph = fx.Graph()
    a, b, c = (graph.placeholder(name) for name in "abc")
    node = graph.call_function(torch.ops.aten.add.Tensor, (b, a), {"alpha": c})
    nested = graph.call_function(torch.cat, ([a, b, a],))
    getter = graph.call_function(operator.getitem, (nested, 0))
    graph.output((node, getter))
    for n in graph.nodes:
        assert isinstance(n._input_nodes, dict)
        assert list(n._input_nodes) == n.all_input_nodes
    assert list(node._input_nodes) == [b, a, c]
    assert list(nested._input_nodes) == [a, b]
    # It follows edits like all_input_nodes does.
    node.args = (a, a)
    assert list(node._input_nodes) == [a, c] == node.all_input_nodes
