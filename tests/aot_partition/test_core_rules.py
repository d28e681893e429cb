"""torch's ban rules on plain core graphs (core/rules.py): each rule fires where torch's would
and stays quiet where it would not, by exact reason; rules are opt-in and named."""

from __future__ import annotations

import pytest
from aot_partition.config import MinCutOptions
from aot_partition.core import CoreGraph, CoreGraphError, CoreNode, default_save_costs, partition
from aot_partition.core.rules import LONG_CHAIN, RULES, TORCH_DEFAULT_RULES, rule_bans
from aot_partition.fx.context import active_rule_names


def fw(node_id, inputs=(), category="pointwise", nbytes=64, **fields):
    return CoreNode(node_id, tuple(inputs), nbytes=nbytes, category=category, forward=True,
                    **fields)


def bw(node_id, inputs=(), category="pointwise", nbytes=64, **fields):
    return CoreNode(node_id, tuple(inputs), nbytes=nbytes, category=category, in_backward=True,
                    **fields)


def mlp(**mm_fields):
    """sum(dropout(relu(x @ w))) and its backward."""
    return CoreGraph((
        fw("x", category="input"), fw("w", category="parameter", nbytes=256),
        fw("mm", ("x", "w"), "compute", op="dot", **mm_fields),
        fw("relu", ("mm",)),
        fw("drop", ("relu",), "random"),
        fw("out", ("drop",), "reduction", nbytes=4, output=True),
        bw("g", (), "tangent", nbytes=4),
        bw("g_drop", ("g", "drop")),
        bw("g_relu", ("g_drop", "relu")),
        bw("g_w", ("relu", "g_relu"), "compute", nbytes=256, backward=True),
    ))


def test_rules_are_opt_in_and_compute_intensive_keeps_the_matmul():
    assert "mm" not in partition(mlp()).banned
    banned = partition(mlp(), rules=("compute_intensive",))
    assert banned.banned["mm"] == "compute-intensive op: dot"
    assert banned.decisions["mm"].kind != "recomputed" and "relu" in banned.saved


@pytest.mark.parametrize("rule, fires, quiet, reason", [
    ("compute_intensive", "mm", "relu", "compute-intensive op: dot"),
    ("random_op", "drop", "relu",
     "random op: recomputing costs a second draw and a saved RNG state"),
    ("not_in_allowlist", "mm", "relu", "not in allowlist: dot is not a recomputable op"),
    ("reduction", "out", "relu", "reduction: output 16x smaller than inputs"),
    ("materialized_in_backward", "relu", "drop",
     "materialized in backward: used unfused by g_w"),
])
def test_per_node_rule_fires_and_stays_quiet(rule, fires, quiet, reason):
    found = rule_bans(mlp(), rule)
    assert found[fires] == reason
    assert quiet not in found
    assert "x" not in found and "g_relu" not in found  # inputs and backward nodes: never


def test_allowlist_reads_the_front_ends_recomputable_flag():
    assert "mm" not in rule_bans(mlp(recomputable=True), "not_in_allowlist")


def test_a_graph_output_is_materialized():
    graph = CoreGraph((fw("x", category="input"), fw("y", ("x",), output=True),
                       fw("z", ("x",)), bw("g", ("z",), backward=True)))
    assert rule_bans(graph, "materialized_in_backward") == {
        "y": "materialized in backward: used unfused by output"}


def test_a_concat_fuses_its_inputs():
    graph = CoreGraph((fw("x", category="input"), fw("mm", ("x",), "compute"),
                       fw("cat", ("mm", "x"), "concat"), bw("g", ("cat",), backward=True)))
    assert "mm" not in rule_bans(graph, "materialized_in_backward")
    assert "cat" in rule_bans(graph, "materialized_in_backward")


def test_effectful_and_collective_categories():
    graph = CoreGraph((fw("x", category="input"),
                       fw("log", ("x",), "effectful", allow_recompute=True),
                       fw("ar", ("x",), "collective"), fw("y", ("ar", "log")),
                       bw("g", ("y",), backward=True)))
    assert rule_bans(graph, "never_recomputable") == {
        "log": "effectful op: recomputing would repeat its side effect"}
    assert rule_bans(graph, "collective") == {
        "ar": "collective: recomputing it repeats network traffic and can deadlock if ranks "
              "disagree"}


def test_too_far_from_backward_counts_hops():
    graph = CoreGraph((fw("x", category="input"), fw("a", ("x",)), fw("b", ("a",)),
                       bw("g", ("b",), backward=True)))
    assert rule_bans(graph, "too_far_from_backward", max_dist_from_bw=1) == {
        "a": "too far from backward: 2 ops > max_dist_from_bw=1"}
    assert rule_bans(graph, "too_far_from_backward") == {}


def _far_apart(late_user_after_matmul):
    """v feeds a (fusible) whose matmul is the first unfusible use; b reads v again."""
    b = fw("b", ("v",))
    mm = fw("mm", ("a",), "compute")
    middle = (mm, b) if late_user_after_matmul else (b, mm)
    return CoreGraph((fw("x", category="input"), fw("v", ("x",)), fw("a", ("v",)), *middle,
                      bw("g", ("mm", "b"), backward=True)))


def test_used_far_apart():
    assert rule_bans(_far_apart(True), "ban_used_far_apart") == {
        "b": "used far apart: v is used before and after an unfusible op"}
    assert rule_bans(_far_apart(False), "ban_used_far_apart") == {}


def _chain(length):
    nodes = [fw("x", category="input"), fw("n0", ("x",))]
    nodes += [fw(f"n{i}", (f"n{i - 1}",)) for i in range(1, length)]
    return CoreGraph((*nodes, bw("g", (f"n{length - 1}",), backward=True)))


def test_long_fusible_chains():
    assert rule_bans(_chain(LONG_CHAIN + 3), "ban_long_fusible_chains") == {
        f"n{LONG_CHAIN + 1}": f"long fusible chain: {LONG_CHAIN + 1} fusible ops from n0"}
    assert rule_bans(_chain(LONG_CHAIN), "ban_long_fusible_chains") == {}


def test_first_rule_in_torchs_order_gives_the_reason_and_release_lifts_it():
    # mm is both compute-intensive and outside the allowlist: the allowlist comes first.
    result = partition(mlp(), rules=("compute_intensive", "not_in_allowlist"))
    assert result.banned["mm"] == "not in allowlist: dot is not a recomputable op"
    released = partition(mlp(), rules=("compute_intensive",), release=("mm",))
    assert "mm" not in released.banned


def test_rule_names_are_checked():
    with pytest.raises(CoreGraphError, match=r"^unknown ban rule 'matmul'; valid rules: "
                                             r"never_recomputable, collective, "):
        partition(mlp(), rules=("matmul",))
    with pytest.raises(CoreGraphError, match=r"^rules must be a collection of rule names, got "
                                             r"'reduction'; e.g. \('reduction',\)"):
        partition(mlp(), rules="reduction")


def test_torch_default_rules_are_the_fx_defaults_and_every_rule_is_named_as_fx_names_it():
    assert TORCH_DEFAULT_RULES == active_rule_names(MinCutOptions())
    assert set(RULES) == set(active_rule_names(MinCutOptions())) | {"random_op",
                                                                      "compute_intensive"}


@pytest.mark.parametrize("field, value, message", [
    ("op", 3, "node 'n' has op 3; must be a string (the op's name, for reasons)"),
    ("fusible", "yes", "node 'n' has fusible 'yes'; must be True, False or None (by category)"),
    ("output", 1, "node 'n' has output 1; must be True or False"),
])
def test_rule_facts_are_type_checked(field, value, message):
    with pytest.raises(CoreGraphError) as info:
        CoreNode("n", **{field: value})
    assert str(info.value) == message


def test_the_save_cost_doubles_only_values_that_never_exist_in_memory():
    def cost_of_y(y, user_category="pointwise", user_fusible=None):
        graph = CoreGraph((fw("x", category="input"), y,
                           fw("z", ("y",), user_category, fusible=user_fusible),
                           bw("g", ("z",), backward=True)))
        return default_save_costs(graph, recompute_views=False, parameters_are_free=True)[1]

    fused = cost_of_y(fw("y", ("x",)))
    assert fused == 2 * int(64 * 1.1 ** 2)                      # every user fuses it
    assert cost_of_y(fw("y", ("x",), output=True)) == fused / 2  # returned: in memory anyway
    assert cost_of_y(fw("y", ("x",)), user_fusible=False) == fused / 2
    assert cost_of_y(fw("y", ("x",), "compute"), "concat") == fused  # a concat fuses it


def test_a_value_that_is_not_saveable_has_an_infinite_save_cost():
    graph = CoreGraph((fw("x", category="input"), fw("y", ("x",), "random", saveable=False),
                       bw("g", ("y",), backward=True)))
    assert default_save_costs(graph, recompute_views=False, parameters_are_free=True)[1] == (
        float("inf"))
    assert rule_bans(graph, "random_op") == {
        "y": "random op: recomputing costs a second draw and a saved RNG state"}


# ---- rules inside budgets (issue 41) ----------------------------------------------------------

def _chain_with_reduction() -> CoreGraph:
    """x (256 bytes) -> red (a reduction to 16 bytes) -> y; the backward reads x and red: x is
    saved anyway, so without rules the cut recomputes red from it, and the reduction rule
    (output 4x smaller than its input) keeps red saved."""
    return CoreGraph((
        fw("x", category="input", nbytes=256),
        fw("red", ("x",), "reduction", op="sum", nbytes=16),
        fw("y", ("red",), nbytes=4, output=True),
        bw("g", (), "tangent", nbytes=4),
        bw("gx", ("g", "red", "x"), nbytes=256, backward=True),
    ))


def test_a_rule_set_changes_what_a_budget_saves_and_a_budget_can_lift_its_bans():
    from aot_partition.core import partition_under_budget

    graph = _chain_with_reduction()
    plain = partition_under_budget(graph, fraction=1.0)
    ruled = partition_under_budget(graph, fraction=1.0, rules=("reduction",))
    assert "red" not in plain.saved and "red" in ruled.saved
    assert "red" in ruled.partition.banned
    # the rule's ban is a knapsack item: the tightest budget lifts it, as it lifts any ban
    lifted = partition_under_budget(graph, fraction=0.0, rules=("reduction",))
    assert "red" not in lifted.saved and "red" in lifted.released


def test_the_opposite_case_a_rule_that_bans_nothing_here_changes_nothing():
    from aot_partition.core import partition_under_budget

    graph = _chain_with_reduction()
    for fraction in (0.0, 0.5, 1.0):
        assert (partition_under_budget(graph, fraction=fraction, rules=("collective",)).saved
                == partition_under_budget(graph, fraction=fraction).saved)


def test_an_unknown_rule_in_a_budget_is_refused():
    from aot_partition.core import partition_under_budget

    with pytest.raises(CoreGraphError, match="unknown ban rule 'reductions'; valid rules: never_recomputable"):
        partition_under_budget(_chain_with_reduction(), fraction=0.5, rules=("reductions",))
