"""The core gives no silent wrong answer (issue 41): a release that would recompute a random or
effectful node without ``allow_recompute`` raises, naming it; a graph with no backward is
refused rather than answered with invented labels."""

from __future__ import annotations

import pytest
from aot_partition.core import CoreGraph, CoreNode, partition, partition_under_budget
from aot_partition.core.graph import CoreGraphError


def _graph(category: str, allow_recompute: bool = False) -> CoreGraph:
    """x -> r (random or effectful) -> y; the backward reads y."""
    return CoreGraph((
        CoreNode("x", nbytes=16, category="input", forward=True),
        CoreNode("r", ("x",), nbytes=16, category=category, forward=True,
                 allow_recompute=allow_recompute),
        CoreNode("y", ("r",), nbytes=16, category="pointwise", forward=True),
        CoreNode("g", nbytes=16, category="tangent", in_backward=True),
        CoreNode("gy", ("g", "y"), nbytes=16, category="pointwise", in_backward=True,
                 backward=True),
    ))


@pytest.mark.parametrize(("category", "consequence"), [
    ("random", "a random node without allow_recompute: recomputing it would draw different "
               "random numbers than the forward did"),
    ("effectful", "an effectful node without allow_recompute: recomputing it would run its "
                  "side effect a second time"),
])
def test_releasing_a_random_or_effectful_node_raises(category, consequence):
    message = (f"release names 'r', {consequence}; set allow_recompute=True on the node only "
               "if the front end replays it exactly")
    with pytest.raises(CoreGraphError) as info:
        partition(_graph(category), release=["r"])
    assert str(info.value) == message
    with pytest.raises(CoreGraphError) as info:
        partition_under_budget(_graph(category), fraction=0.0, release=["r"])
    assert str(info.value) == message


def test_the_opposite_case_allow_recompute_lets_it_be_released():
    result = partition(_graph("random", allow_recompute=True), release=["r"])
    assert "r" not in result.saved


def test_a_graph_with_no_backward_is_refused():
    """What jax.value_and_grad's jaxpr looks like: the gradients computed in one graph, no
    tangent input and nothing marked in_backward."""
    whole_step = CoreGraph((
        CoreNode("x", nbytes=16, category="input", forward=True),
        CoreNode("w", nbytes=16, category="parameter", forward=True),
        CoreNode("y", ("x", "w"), nbytes=16, category="compute", forward=True),
        CoreNode("dw", ("x", "y"), nbytes=16, category="compute", forward=True,
                 backward=True),
    ))
    expected = ("the graph has no backward: no node is in_backward and none is a tangent, so "
                "there is nothing to split; mark the backward's nodes in_backward=True (those "
                "that depend on the gradient seed, which is a tangent input), or do not "
                "partition a forward-only graph")
    for run in (lambda: partition(whole_step),
                lambda: partition_under_budget(whole_step, fraction=0.5)):
        with pytest.raises(CoreGraphError) as info:
            run()
        assert str(info.value) == expected
