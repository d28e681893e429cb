"""``partition_under_budget``'s ``fraction_of``: torch's meaning of a fraction, by name, in the
core (plain data, no torch)."""

from __future__ import annotations

import pytest
from aot_partition.core import CoreGraph, CoreGraphError, CoreNode, partition_under_budget
from aot_partition.core.budget import FRACTION_OF


def _chain(layers: int = 6) -> CoreGraph:
    """x -> r (a random op: saved in every cut) -> a0 -> a1 -> ... (64 bytes each, runtime
    1, 2, ...), each read by the backward: the least cut saves r's 128 bytes, so the two
    meanings of a fraction differ."""
    nodes = [CoreNode("x", nbytes=64, category="input", forward=True),
             CoreNode("g", category="tangent", in_backward=True),
             CoreNode("r", ("x",), nbytes=128, category="random", forward=True)]
    previous = "r"
    for i in range(layers):
        nodes.append(CoreNode(f"a{i}", (previous,), nbytes=64, forward=True, runtime=1.0 + i))
        previous = f"a{i}"
    grads = [CoreNode(f"d{i}", ("g", f"a{i}"), nbytes=64, in_backward=True, backward=True)
             for i in range(layers)]
    grads.append(CoreNode("dr", ("g", "r"), nbytes=128, in_backward=True, backward=True))
    return CoreGraph(tuple(nodes + grads))


def test_the_meanings_are_named():
    assert FRACTION_OF == ("span", "runtime_optimal")


def test_runtime_optimal_meaning_caps_a_fraction_of_the_optimal_cut():
    graph = _chain()
    optimal = partition_under_budget(graph, fraction=1.0, fraction_of="runtime_optimal")
    assert optimal.saved == partition_under_budget(graph, fraction=1.0).saved
    least = partition_under_budget(graph, fraction=0.0)
    for fraction in (0.8, 0.5, 0.2, 0.0):
        answer = partition_under_budget(graph, fraction=fraction, fraction_of="runtime_optimal")
        # Within the fraction of the optimal cut's bytes, or the least cut when none is.
        assert (answer.saved_bytes <= fraction * optimal.saved_bytes
                or answer.saved_bytes == least.saved_bytes), fraction
        assert answer.budget.fraction_of == "runtime_optimal"
        assert "torch's meaning" in answer.budget.describe()
        span = partition_under_budget(graph, fraction=fraction)
        # torch's meaning never allows more than the span's at the same fraction.
        assert answer.saved_bytes <= span.saved_bytes, fraction
    assert least.saved_bytes > 0  # so the meanings differ between the ends:
    assert (partition_under_budget(graph, fraction=0.5, fraction_of="runtime_optimal").saved
            != partition_under_budget(graph, fraction=0.5).saved)


def test_a_fraction_never_raises_below_every_cut():
    graph = _chain()
    least = partition_under_budget(graph, fraction=0.0)
    answer = partition_under_budget(graph, fraction=0.0, fraction_of="runtime_optimal")
    assert answer.saved_bytes == least.saved_bytes


def test_fraction_of_is_checked():
    graph = _chain()
    with pytest.raises(CoreGraphError, match="fraction_of must be one of"):
        partition_under_budget(graph, fraction=0.5, fraction_of="torch")
    with pytest.raises(CoreGraphError, match="applies to a fraction budget"):
        partition_under_budget(graph, max_saved_bytes=64, fraction_of="runtime_optimal")
