"""Budgets on plain data (core/budget.py): a fraction, a byte cap and a peak cap, runtime-aware,
monotone and deterministic, with the fx path's UnreachableMemoryBudgetError wording."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aot_partition.core import (
    CoreGraph,
    CoreGraphError,
    CoreNode,
    partition,
    partition_under_budget,
    simulate_memory,
)
from aot_partition.core.timeline import decision_kinds
from aot_partition.errors import UnreachableMemoryBudgetError
from core_graphs import mlp


def two_branches(a_runtime: float, b_runtime: float) -> CoreGraph:
    """x (16 bytes) feeds a and b (64 bytes each); the backward reads both: saving both is
    128 bytes, one 64 (x too, free: an input, to recompute the other), none 0: room for one
    at 0.75."""
    return CoreGraph((
        CoreNode("x", nbytes=16, category="input", forward=True),
        CoreNode("a", ("x",), nbytes=64, category="other", forward=True, runtime=a_runtime),
        CoreNode("b", ("x",), nbytes=64, category="other", forward=True, runtime=b_runtime),
        CoreNode("out", ("a", "b"), nbytes=4, category="reduction", forward=True),
        CoreNode("g", nbytes=4, category="tangent", in_backward=True),
        CoreNode("ga", ("g", "a"), nbytes=64, category="pointwise", in_backward=True),
        CoreNode("gb", ("g", "b"), nbytes=64, category="pointwise", in_backward=True),
        CoreNode("gx", ("ga", "gb"), nbytes=64, category="pointwise", in_backward=True,
                 backward=True),
    ))


def peaky() -> CoreGraph:
    """``big`` saved stays alive while the forward makes ``d``: recomputing it lowers the peak."""
    return CoreGraph((
        CoreNode("x", nbytes=64, category="input", forward=True),
        CoreNode("big", ("x",), nbytes=1000, category="pointwise", forward=True, runtime=1.0),
        CoreNode("s1", ("big",), nbytes=4, category="reduction", forward=True),
        CoreNode("d", ("x",), nbytes=1000, category="pointwise", forward=True, runtime=1.0),
        CoreNode("s2", ("d",), nbytes=4, category="reduction", forward=True),
        CoreNode("out", ("s1", "s2"), nbytes=4, category="pointwise", forward=True),
        CoreNode("g", nbytes=4, category="tangent", in_backward=True),
        CoreNode("gbig", ("g", "big"), nbytes=64, category="reduction", in_backward=True),
        CoreNode("gd", ("g", "x"), nbytes=64, category="pointwise", in_backward=True),
        CoreNode("gx", ("gbig", "gd"), nbytes=64, category="pointwise", in_backward=True,
                 backward=True),
    ))


def test_budget_one_is_the_runtime_optimal_cut():
    # Must fire: with runtimes the matmul and relu are not recomputed at 1.0, where the plain
    # min cut (bytes only) recomputes both.
    answer = partition_under_budget(mlp(), fraction=1.0)
    assert answer.label == "runtime-optimal"
    assert answer.saved == ("x", "w", "relu") and answer.recompute_runtime == 0.0
    assert partition(mlp()).saved == ("x", "w")
    assert answer.saved == partition(mlp(), bans={"mm": "slow", "relu": "slow"}).saved
    # Must not: without runtimes, 1.0 is the plain min cut.
    assert partition_under_budget(mlp(0.0, 0.0), fraction=1.0).saved == partition(mlp()).saved


def test_budget_zero_recomputes_everything_it_may():
    answer = partition_under_budget(mlp(), fraction=0.0)
    # x and w are inputs: saving them costs nothing (the one measure of saved bytes)
    assert (answer.label, answer.saved, answer.saved_bytes) == ("recompute everything",
                                                                 ("x", "w"), 0)
    assert answer.recompute_runtime == 9.0  # mm and relu
    assert answer.released == {"mm": "recomputing it costs runtime 8",
                               "relu": "recomputing it costs runtime 1"}


@pytest.mark.parametrize(("a_runtime", "b_runtime", "saved", "recomputed"),
                         [(100.0, 1.0, "a", "b"), (1.0, 100.0, "b", "a")])
def test_the_knapsack_keeps_the_costly_recompute_saved(a_runtime, b_runtime, saved, recomputed):
    answer = partition_under_budget(two_branches(a_runtime, b_runtime), fraction=0.75)
    assert answer.saved == ("x", saved)
    assert answer.partition.decisions[recomputed].kind == "recomputed"
    assert answer.recompute_runtime == min(a_runtime, b_runtime)


@pytest.mark.parametrize("knapsack", ["dp", "greedy", "ilp"])
def test_fraction_sweep_is_monotone_and_deterministic(knapsack):
    graph = two_branches(100.0, 1.0)
    answers = [partition_under_budget(graph, fraction=i / 32, knapsack=knapsack)
               for i in range(33)]
    saved = [a.saved_bytes for a in answers]
    runtime = [a.recompute_runtime for a in answers]
    assert saved == sorted(saved) and runtime == sorted(runtime, reverse=True)
    assert (saved[0], saved[24], saved[-1]) == (0, 64, 128)  # three distinct cuts
    again = [partition_under_budget(two_branches(100.0, 1.0), fraction=i / 32,
                                    knapsack=knapsack).saved for i in range(33)]
    assert again == [a.saved for a in answers]


def test_recompute_runtime_and_kinds_are_the_decisions_ones():
    # The budget and the timeline read kinds without building every decision: they must agree.
    for graph in (mlp(), two_branches(100.0, 1.0), peaky()):
        for fraction in (0.0, 0.25, 0.75, 1.0):
            answer = partition_under_budget(graph, fraction=fraction)
            decisions = answer.partition.decisions.values()
            assert decision_kinds(answer.partition) == [d.kind for d in decisions]
            decided = sum(graph.nodes[graph.index[d.id]].runtime for d in decisions
                          if d.kind == "recomputed")
            assert answer.recompute_runtime == decided


def test_front_end_bans_are_lifted_by_the_budget_category_bans_never():
    # Without runtimes, a's own ban and b's call ban keep them saved at 1.0; 0.0 lifts both.
    nodes = list(two_branches(0.0, 0.0).nodes)
    nodes[1] = CoreNode("a", ("x",), nbytes=64, category="other", forward=True, ban="slow op")
    top = partition_under_budget(nodes, fraction=1.0, bans={"b": "slow too"})
    assert top.saved == ("a", "b")
    bottom = partition_under_budget(nodes, fraction=0.0, bans={"b": "slow too"})
    assert bottom.saved == ("x",)
    assert bottom.released == {"a": "slow op", "b": "slow too"}
    # Twin: a random op's category ban is never lifted, so it stays saved at 0.0.
    nodes[1] = CoreNode("a", ("x",), nbytes=64, category="random", forward=True)
    assert partition_under_budget(nodes, fraction=0.0).partition.banned == {
        "x": "primal input",
        "a": "random op: recomputing costs a second draw and a saved RNG state"}
    assert "a" in partition_under_budget(nodes, fraction=0.0).saved


def test_byte_cap_sweep_is_monotone_and_names_the_least_reachable():
    graph = two_branches(100.0, 1.0)
    answers = [partition_under_budget(graph, max_saved_bytes=cap) for cap in range(0, 140, 4)]
    saved = [a.saved_bytes for a in answers]
    assert saved == sorted(saved)
    assert all(a.saved_bytes <= cap for a, cap in zip(answers, range(0, 140, 4)))
    # 0 bytes is reachable: only the input x (alive anyway) is saved
    assert partition_under_budget(graph, max_saved_bytes=0).saved == ("x",)
    assert partition_under_budget(graph, max_saved_bytes=127).saved == ("x", "a")
    assert partition_under_budget(graph, max_saved_bytes=128).saved == ("a", "b")
    # A value no budget may recompute (a random op) must be saved: below it is unreachable.
    nodes = list(graph.nodes)
    nodes[1] = CoreNode("a", ("x",), nbytes=64, category="random", forward=True)
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        partition_under_budget(nodes, max_saved_bytes=63)
    assert str(info.value) == ("activation memory budget 63 bytes is unreachable: the least "
                               "this graph can save is 64 bytes (recompute everything)")
    assert info.value.what == "activation memory budget"


def test_peak_cap_recomputes_to_lower_the_peak():
    optimal = partition_under_budget(peaky(), fraction=1.0)
    assert optimal.saved == ("x", "big") and optimal.peak_bytes == 2072
    assert optimal.timeline.peak_at == "forward s2"
    capped = partition_under_budget(peaky(), max_peak_bytes=2000)
    assert capped.saved == ("x",) and capped.peak_bytes == 1136
    # An ample cap keeps the runtime-optimal cut.
    assert partition_under_budget(peaky(), max_peak_bytes=2072).saved == ("x", "big")
    peaks = [partition_under_budget(peaky(), max_peak_bytes=c).peak_bytes
             for c in range(1136, 2200, 50)]
    assert peaks == sorted(peaks)
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        partition_under_budget(peaky(), max_peak_bytes=1000)
    assert str(info.value) == ("simulated memory peak cap 1000 bytes is unreachable: the least "
                               "this graph can peak at is 1136 bytes (recompute everything)")
    assert info.value.what == "simulated memory peak cap"


def test_timeline_counts_by_hand():
    # x 64 + w 256 held; mm, relu; relu saved; the backward's gradients stay (see module doc).
    timeline = simulate_memory(partition(mlp(), bans={"relu": "keep"}))
    assert timeline.baseline_bytes == 320
    assert [(phase, node, live) for phase, node, live in timeline.steps] == [
        ("forward", "mm", 384), ("forward", "relu", 448), ("forward", "out", 388),
        ("backward", "g_relu", 456), ("backward", "g_w", 644), ("backward", "g_x", 708)]
    assert (timeline.peak_bytes, timeline.peak_at) == (708, "backward g_x")


def test_report_names_the_budget_and_speaks_core_words():
    report = partition_under_budget(mlp(), max_saved_bytes=63).report()
    assert report.budget == "saved-bytes cap 63 bytes"
    assert (report.chosen, report.saved_bytes, report.peak_bytes) == ("recompute everything",
                                                                       0, 708)
    assert report.by_kind("recomputed") == ("mm", "relu")
    rows = {row.id: row for row in report.nodes}
    assert rows["mm"].reason == ("recomputed in backward: the budget lifted its ban "
                                 "(recomputing it costs runtime 8)")
    assert rows["mm"].ban == "recomputing it costs runtime 8"
    assert rows["x"].reason == "saved: cut; banned: primal input"
    text = report.format()
    assert text.splitlines()[0] == ("saved-bytes cap 63 bytes: took the recompute everything "
                                    "cut; saves 0 bytes, simulated peak 708 bytes, recompute "
                                    "runtime 9")
    for fx_word in ("meta['val']", "MUST_SAVE", "fx", "placeholder", "aten"):
        assert fx_word not in text
    fraction = partition_under_budget(mlp(), fraction=0.5).report()
    assert fraction.budget.startswith("memory budget 0.5 ")
    assert partition_under_budget(peaky(), max_peak_bytes=2000).report().budget == (
        "simulated peak cap 2000 bytes")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "give exactly one budget: fraction (0 to 1), max_saved_bytes or max_peak_bytes; got "
         "none"),
    ({"fraction": 0.5, "max_saved_bytes": 8}, "give exactly one budget: fraction (0 to 1), "
     "max_saved_bytes or max_peak_bytes; got fraction, saved_bytes"),
    ({"fraction": 1.5}, "fraction must be a number between 0 and 1 (0 = recompute everything, "
     "1 = runtime-optimal); got 1.5"),
    ({"fraction": True}, "fraction must be a number between 0 and 1 (0 = recompute "
     "everything, 1 = runtime-optimal); got True"),
    ({"max_saved_bytes": 1.5}, "max_saved_bytes must be an int >= 0 (bytes); got 1.5"),
    ({"max_peak_bytes": -1}, "max_peak_bytes must be an int >= 0 (bytes); got -1"),
    ({"fraction": 0.5, "knapsack": "nope"}, "unknown knapsack solver 'nope'; valid: dp, "
     "greedy, ilp"),
    ({"fraction": 0.5, "release": ("x",)}, "release names 'x', an input (category 'input'); "
     "inputs are never recomputed, so their ban cannot be lifted"),
])
def test_bad_budgets_are_named(kwargs, message):
    with pytest.raises(CoreGraphError) as info:
        partition_under_budget(mlp(), **kwargs)
    assert str(info.value) == message


def test_a_released_node_is_no_knapsack_item():
    # release= lifts the runtime ban too: mm is recomputed even at 1.0.
    answer = partition_under_budget(mlp(), fraction=1.0, release=("mm",))
    assert answer.saved == ("x", "w", "relu")
    assert partition_under_budget(mlp(), fraction=1.0, release=("mm", "relu")).saved == ("x",
                                                                                         "w")


def _repeated_layers(layers: int = 40) -> CoreGraph:
    """A chain of ``layers`` identical 3-node layers (the same bytes and runtimes per layer
    position) and its backward: the knapsack's items repeat ``layers`` times."""
    nodes = [CoreNode("x", nbytes=64, category="input", forward=True)]
    prev = "x"
    for layer in range(layers):
        for k, runtime in enumerate((5.0, 1.0, 3.0)):
            name = f"f{layer}_{k}"
            nodes.append(CoreNode(name, (prev,), nbytes=64 * (k + 1), category="pointwise",
                                  forward=True, runtime=runtime))
            prev = name
    nodes.append(CoreNode("g", nbytes=64, category="tangent", in_backward=True))
    back = "g"
    for layer in reversed(range(layers)):
        for k in reversed(range(3)):
            name = f"b{layer}_{k}"
            nodes.append(CoreNode(name, (back, f"f{layer}_{k}"), nbytes=64, category="pointwise",
                                  in_backward=True, backward=(layer == 0 and k == 0)))
            back = name
    return CoreGraph(tuple(nodes))


def test_repeated_layers_solve_one_bounded_item_per_kind_with_the_same_optimum():
    from aot_partition.core.budget import _grouped
    from aot_partition.core.knapsack import dp_knapsack

    graph = _repeated_layers()
    answers = [partition_under_budget(graph, fraction=i / 32) for i in range(33)]
    saved = [a.saved_bytes for a in answers]
    runtime = [a.recompute_runtime for a in answers]
    assert saved == sorted(saved) and runtime == sorted(runtime, reverse=True)
    assert len(set(saved)) > 10  # many distinct cuts, not three
    # The grouped knapsack keeps as much runtime as the item-by-item one, at every fraction.
    memories = [64.0 * (k + 1) / 7680 for _ in range(40) for k in range(3)]
    runtimes = [r for _ in range(40) for r in (5.0, 1.0, 3.0)]
    solve = _grouped(dp_knapsack, memories, runtimes)
    for fraction in (0.1, 0.25, 0.5, 0.75, 0.9):
        kept = set(range(len(memories))) - set(solve(fraction))
        assert sum(memories[k] for k in kept) <= fraction + 1e-9
        assert sum(runtimes[k] for k in kept) == dp_knapsack(memories, runtimes, fraction)[0]


def read_far_from_the_inputs(middle: str = "compute") -> CoreGraph:
    """x @ w, then t = pointwise(mm) and out = sum(t); the backward reads only t (gt = g * t).
    The min cut prices x 64 * 1.1**3 (three hops from the backward) and mm 64 * 1.1**2, so its
    recompute-everything cut (every ban lifted) saves mm (64 bytes), though x and w cost
    nothing in the byte measure and the backward can recompute mm and t from them (issue 52,
    item 5)."""
    return CoreGraph((
        CoreNode("x", nbytes=64, category="input", forward=True),
        CoreNode("w", nbytes=256, category="parameter", forward=True),
        CoreNode("mm", ("x", "w"), nbytes=64, category=middle, forward=True, runtime=8.0),
        CoreNode("t", ("mm",), nbytes=64, category="pointwise", forward=True, runtime=1.0),
        CoreNode("out", ("t",), nbytes=4, category="reduction", forward=True, runtime=1.0),
        CoreNode("g", nbytes=4, category="tangent", in_backward=True),
        CoreNode("gt", ("g", "t"), nbytes=64, category="pointwise", in_backward=True,
                 backward=True),
    ))


def test_a_zero_byte_cap_recomputes_from_the_free_inputs():
    graph = read_far_from_the_inputs()
    # Must fire: the cut that lifts every ban, priced as the min cut prices, saves mm.
    assert partition(graph).saved == ("mm",)
    for budget in ({"max_saved_bytes": 0}, {"fraction": 0.0},
                   {"fraction": 0.0, "fraction_of": "runtime_optimal"}):
        answer = partition_under_budget(graph, **budget)
        assert (answer.saved, answer.saved_bytes) == (("x", "w"), 0), budget
        assert answer.label == "recompute everything, fewest bytes"
        assert answer.recompute_runtime == 9.0  # mm and t
        assert {k: d.kind for k, d in answer.partition.decisions.items()
                if d.kind == "recomputed"} == {"mm": "recomputed", "t": "recomputed"}
    # 1.0 stays the runtime-optimal cut (t saved, nothing recomputed); the span is 0 to 64.
    optimal = partition_under_budget(graph, fraction=1.0)
    assert (optimal.label, optimal.saved, optimal.recompute_runtime) == (
        "runtime-optimal", ("t",), 0.0)
    assert partition_under_budget(graph, max_saved_bytes=63).saved == ("x", "w")
    assert partition_under_budget(graph, max_saved_bytes=64).saved == ("t",)


def test_without_runtimes_a_zero_byte_cap_still_recomputes_from_the_inputs():
    """No runtime, so no knapsack item: the only other cut is the inputs' one."""
    graph = CoreGraph(tuple(replace(n, runtime=0.0) for n in read_far_from_the_inputs().nodes))
    assert partition_under_budget(graph, fraction=1.0).saved == ("mm",)
    answer = partition_under_budget(graph, max_saved_bytes=0)
    assert (answer.saved, answer.saved_bytes, answer.recompute_runtime) == (("x", "w"), 0, 0.0)


def test_what_cannot_be_recomputed_from_the_inputs_keeps_its_floor():
    """The opposite case: mm is a random op (never recomputed without allow_recompute), so
    the backward needs mm or t saved whatever the inputs cost: 64 bytes is the floor."""
    graph = read_far_from_the_inputs(middle="random")
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        partition_under_budget(graph, max_saved_bytes=0)
    assert str(info.value) == ("activation memory budget 0 bytes is unreachable: the least "
                               "this graph can save is 64 bytes (runtime-optimal)")
    assert (info.value.cap, info.value.least) == (0, 64)
    answer = partition_under_budget(graph, fraction=0.0)
    assert answer.saved_bytes == 64 and answer.saved in (("mm",), ("t",))
    assert partition_under_budget(graph, max_saved_bytes=64).saved_bytes == 64
