"""Finer budgets on plain data (issue 41, item 4): a fraction i/32 whose best candidate would
repeat the answer of (i-1)/32 is refined until it gets a cut of its own where the refinement
finds one, and a byte cap is refined to within 1/1024 of the span below it; on jaxpr-like
transformers under jax's ``dots_saveable`` bytes, the core recomputes no more FLOPs than
``dots_saveable`` does (issue 52, item 6: wherever the core may make that cut). No torch: the
graph is built here in plain dicts."""

from __future__ import annotations

import pytest
from aot_partition.core import CoreGraph, partition_under_budget
from aot_partition.core.rules import TORCH_DEFAULT_RULES
from aot_partition.errors import UnreachableMemoryBudgetError
from jaxpr_graphs import policy_cut, transformer_step
from jaxpr_graphs import random_step as _random_step


def _limits(graph: CoreGraph) -> list[float]:
    least = partition_under_budget(graph, fraction=0.0).saved_bytes
    most = partition_under_budget(graph, fraction=1.0).saved_bytes
    return [least + (i / 32) * (most - least) for i in range(33)]


def test_the_transformer_is_a_training_step():
    graph, batched = transformer_step()
    assert len(graph.nodes) == 331 and len(batched) == 4
    assert sum(n.backward for n in graph.nodes) == 18  # 2 x 8 layer parameters, gf, wout
    assert sum(n.op == "dot_general" and n.forward for n in graph.nodes) == 17


def test_every_fraction_gets_a_cut_of_its_own():
    """Before the refinement, 22/32 to 31/32 all gave the 22/32 cut (4,157,440 bytes: nothing
    between it and 6.25 MB at 1.0) and 33 fractions gave 24 answers. Must fire: 23/32 now
    saves more than 22/32's limit allows, with less recompute."""
    graph, _ = transformer_step()
    answers = [partition_under_budget(graph, fraction=i / 32) for i in range(33)]
    limits = _limits(graph)
    saved = [a.saved_bytes for a in answers]
    runtime = [a.recompute_runtime for a in answers]
    assert saved == sorted(saved) and runtime == sorted(runtime, reverse=True)
    assert len({a.saved for a in answers}) == 33
    # every fraction saves more than the fraction below it may: a distinct cut, never over
    assert all(limits[i - 1] < saved[i] <= limits[i] for i in range(1, 33))
    assert saved[22] == 4_157_440 and saved[23] > limits[22]
    assert runtime[23] < runtime[22]
    assert answers[23].label == "refined: 15 of 86 items released"


def test_no_distinct_cut_no_new_answer():
    """Must not fire: x feeds a and b (64 bytes each), the backward reads both: the only cuts
    save 0, 64 or 128 bytes. Every fraction below 1/2 must keep the recompute-everything cut
    (64 bytes do not fit), however the search refines."""
    graph = CoreGraph.from_dicts([
        {"id": "x", "nbytes": 16, "category": "input", "forward": True},
        {"id": "a", "inputs": ["x"], "nbytes": 64, "forward": True, "runtime": 100.0},
        {"id": "b", "inputs": ["x"], "nbytes": 64, "forward": True, "runtime": 1.0},
        {"id": "out", "inputs": ["a", "b"], "nbytes": 4, "category": "reduction",
         "forward": True},
        {"id": "g", "nbytes": 4, "category": "tangent", "in_backward": True},
        {"id": "ga", "inputs": ["g", "a"], "nbytes": 64, "in_backward": True},
        {"id": "gb", "inputs": ["g", "b"], "nbytes": 64, "in_backward": True},
        {"id": "gx", "inputs": ["ga", "gb"], "nbytes": 64, "in_backward": True,
         "backward": True},
    ])
    answers = [partition_under_budget(graph, fraction=i / 32) for i in range(33)]
    assert [a.saved_bytes for a in answers[:16]] == [0] * 16
    assert {a.label for a in answers[:16]} == {"recompute everything"}
    assert [a.saved_bytes for a in answers[16:32]] == [64] * 16 and answers[32].saved_bytes == 128


def test_no_more_recompute_than_dots_saveable_under_its_bytes():
    """jax.checkpoint_policies.dots_saveable saves every dot_general's output and recomputes
    the rest; dots_with_no_batch_dims_saveable recomputes the attention dots too. Under a cap of
    what each saves, the core recomputes no more FLOPs. Before: 3,964,928 FLOPs under
    dots_saveable's 2,097,152 bytes (it recomputes 2,524,416)."""
    graph, batched = transformer_step()
    dots = policy_cut(graph, lambda n: n.op == "dot_general")
    no_batch = policy_cut(graph, lambda n: n.op == "dot_general" and n.id not in batched)
    assert dots == (2_097_152, 2_524_416.0)
    assert no_batch == (1_441_792, 10_913_024.0)
    for cap, flops in (dots, no_batch):
        ours = partition_under_budget(graph, max_saved_bytes=cap)
        assert ours.saved_bytes <= cap
        assert ours.recompute_runtime <= flops, (cap, ours.recompute_runtime, flops)
    # The cut that keeps the compute nodes saved and prices by bytes recomputes less still.
    answer = partition_under_budget(graph, max_saved_bytes=dots[0])
    assert (answer.saved_bytes, answer.recompute_runtime) == (2_097_152, 2_327_808.0)
    assert answer.label == "compute saved, the rest recomputed"


def test_no_more_recompute_than_dots_saveable_on_a_wider_transformer():
    """3 layers of width 128 (470 nodes): no knapsack cut nor refinement came near
    dots_saveable's cut. Before: 7,340,032 FLOPs under its 4,194,304 bytes (it recomputes
    4,392,704). Every policy that saves the compute nodes and recomputes the rest is a cut of
    the "compute saved" network, so under its bytes the core recomputes no more."""
    graph, _ = transformer_step(layers=3, dim=128)
    assert len(graph.nodes) == 470
    cap, flops = policy_cut(graph, lambda n: n.op == "dot_general")
    assert (cap, flops) == (4_194_304, 4_392_704.0)
    answer = partition_under_budget(graph, max_saved_bytes=cap)
    assert answer.saved_bytes <= cap and answer.recompute_runtime <= flops
    assert (answer.saved_bytes, answer.recompute_runtime) == (4_194_304, 3_802_880.0)


def _dropout_after_a_dot(allow_recompute: bool) -> CoreGraph:
    """x @ w (64 bytes), a random op on it (256 bytes: a dropout of a broadcast), a pointwise
    op the backward reads (256 bytes). dots_saveable saves mm and recomputes the rest (jax
    replays the random bits from their key); the core recomputes a random node only with
    allow_recompute (the front end replays it)."""
    return CoreGraph.from_dicts([
        {"id": "x", "nbytes": 64, "category": "input", "forward": True},
        {"id": "w", "nbytes": 256, "category": "parameter", "forward": True},
        {"id": "mm", "inputs": ["x", "w"], "nbytes": 64, "category": "compute",
         "forward": True, "runtime": 1000.0},
        {"id": "r", "inputs": ["mm"], "nbytes": 256, "category": "random", "forward": True,
         "runtime": 64.0, "allow_recompute": allow_recompute},
        {"id": "t", "inputs": ["r"], "nbytes": 256, "category": "pointwise", "forward": True,
         "runtime": 64.0},
        {"id": "out", "inputs": ["t"], "nbytes": 4, "category": "reduction", "forward": True},
        {"id": "g", "nbytes": 4, "category": "tangent", "in_backward": True},
        {"id": "gt", "inputs": ["g", "t"], "nbytes": 256, "category": "pointwise",
         "in_backward": True, "backward": True},
    ])


def test_dots_saveable_is_matched_only_where_the_core_may_make_its_cut():
    """Must not hold: dots_saveable's cut recomputes a random node the core may not recompute
    (no allow_recompute), so its 64 bytes are out of the core's reach. With allow_recompute the
    same graph holds."""
    saveable = lambda node: node.category == "compute"  # noqa: E731 - dots_saveable's test
    cap, flops = policy_cut(_dropout_after_a_dot(False), saveable)
    assert (cap, flops) == (64, 128.0)
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        partition_under_budget(_dropout_after_a_dot(False), max_saved_bytes=cap)
    assert str(info.value) == ("activation memory budget 64 bytes is unreachable: the least "
                               "this graph can save is 256 bytes (runtime-optimal)")
    answer = partition_under_budget(_dropout_after_a_dot(True), max_saved_bytes=cap)
    assert (answer.saved, answer.saved_bytes, answer.recompute_runtime) == (("mm",), 64, 128.0)


def test_refined_answers_do_not_depend_on_the_calls_before():
    graph, _ = transformer_step()
    caps = (1_000_000, 2_097_152, 4_500_000)
    first = [partition_under_budget(graph, max_saved_bytes=c).saved for c in caps]
    sweep = [partition_under_budget(graph, fraction=i / 32).saved for i in range(33)]
    fresh, _ = transformer_step()
    assert [partition_under_budget(fresh, fraction=i / 32).saved for i in range(33)] == sweep
    assert [partition_under_budget(fresh, max_saved_bytes=c).saved for c in caps] == first


def test_byte_caps_are_monotone_and_reach_within_the_resolution():
    graph, _ = transformer_step()
    limits = _limits(graph)
    caps = range(200_000, 6_254_592, 97_000)
    answers = [partition_under_budget(graph, max_saved_bytes=c) for c in caps]
    runtime = [a.recompute_runtime for a in answers]
    assert runtime == sorted(runtime, reverse=True)
    assert all(a.saved_bytes <= c for a, c in zip(answers, caps))
    # a cap never gets less than the 1/32 fractions its limit meets
    for answer, cap in zip(answers, caps):
        below = max(i for i in range(33) if limits[i] <= cap)
        assert answer.recompute_runtime <= partition_under_budget(
            graph, fraction=below / 32).recompute_runtime


@pytest.mark.parametrize("rules", [(), TORCH_DEFAULT_RULES], ids=["no rules", "torch's rules"])
def test_no_more_recompute_than_saving_the_compute_nodes_on_random_graphs(rules):
    """Under the bytes of the policy that saves the compute nodes the backward reads and
    recomputes the rest (dots_saveable), the core recomputes no more. Before the "compute
    saved" cut, 8 of these 60 graphs (50 of the first 400) recomputed more."""
    for seed in range(60):
        graph = _random_step(seed)
        cap, flops = policy_cut(graph, lambda n: n.category == "compute")
        answer = partition_under_budget(graph, max_saved_bytes=cap, rules=rules)
        assert answer.saved_bytes <= cap, seed
        assert answer.recompute_runtime <= flops, (seed, answer.recompute_runtime, flops)
