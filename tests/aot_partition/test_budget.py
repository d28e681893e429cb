"""Activation-memory budget: eager-equal at every budget and solver, monotone, clear errors."""

from __future__ import annotations

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition
from aot_partition.budget.search import BUDGET_SOLVERS, BudgetSearch, choose_saved_values_set
from aot_partition.fx.classify import classify
from aot_partition.fx.sizes import saved_activation_bytes
from aot_partition.partitioners import partition_with_report
from torch._functorch import config as torch_config
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut_partition,
)
from zoo import ZOO, assert_matches_eager, make_case


def budget_cases():
    for name in ZOO:
        yield pytest.param(name, 1.0, "dp", id=f"{name}-1.0")
        yield pytest.param(name, 0.0, "dp", id=f"{name}-0.0")
        # Every solver on the transformer stacks (where the knapsack runs); dp elsewhere.
        for solver in BUDGET_SOLVERS if name in ("gpt", "llama") else ("dp",):
            yield pytest.param(name, 0.5, solver, id=f"{name}-0.5-{solver}")


@pytest.mark.parametrize(("name", "budget", "solver"), list(budget_cases()))
def test_zoo_matches_eager_under_budget(name, budget, solver, aot_with):
    with functorch_config.patch(activation_memory_budget=budget,
                                activation_memory_budget_solver=solver):
        assert_matches_eager(make_case(name), aot_with(min_cut_rematerialization_partition))


def test_convnet_below_budget_one_where_torch_fails(aot_with):
    # Training-mode batch norm reads running stats that the runtime updates after the forward.
    # torch's partitioner recomputes it in the backward under a budget and trips autograd's
    # version check; ours keeps it in the forward (save_readers_of_mutated_inputs).
    with torch_config.patch(activation_memory_budget=0.5), pytest.raises(
            RuntimeError, match="modified by an inplace operation"):
        assert_matches_eager(make_case("convnet"), aot_with(torch_min_cut_partition))
    for budget in (0.5, 0.2):
        with functorch_config.patch(activation_memory_budget=budget):
            assert_matches_eager(make_case("convnet"), aot_with(min_cut_rematerialization_partition))


def saved_bytes(joint, budget, solver="dp", estimator=None):
    """Saved activation bytes under ``solver`` and ``estimator`` (None: the flag's default)."""
    estimator = estimator or functorch_config.activation_memory_budget_runtime_estimator
    with functorch_config.patch(activation_memory_budget_solver=solver,
                                activation_memory_budget_runtime_estimator=estimator):
        fw, _, _ = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                         memory_budget=budget)
    return saved_activation_bytes(fw, joint.num_fwd_outputs)


def torch_saved_bytes(joint, budget):
    with torch_config.patch(activation_memory_budget=budget):
        fw, _ = torch_min_cut_partition(joint.fresh(), joint.inputs,
                                        num_fwd_outputs=joint.num_fwd_outputs)
    return saved_activation_bytes(fw, joint.num_fwd_outputs)


def joint_of(name, capture):
    case = make_case(name)
    return capture(case.module, *case.inputs)


@pytest.mark.parametrize(("name", "solver"), [("mlp", "dp"), ("views", "dp"), ("llama", "dp"),
                                             ("gpt", "dp"), ("gpt", "greedy"),
                                             ("gpt", "dp_graph"), ("gpt", "ilp_graph")])
def test_saved_bytes_never_grow_as_budget_falls(name, solver, capture):
    joint = joint_of(name, capture)
    sizes = [saved_bytes(joint, b, solver) for b in (1.0, 0.7, 0.3, 0.0)]
    assert sizes == sorted(sizes, reverse=True), sizes
    if name in ("gpt", "llama"):  # deep enough that there is something to recompute
        assert sizes[-1] < sizes[0]


def test_dp_budget_saves_no_more_than_torch(capture):
    # Under torch's estimator ("flops"). Ours defaults to "roofline", which weighs recompute
    # by memory traffic and may keep other (more) bytes at the same fraction.
    joint = joint_of("gpt", capture)
    for budget in (1.0, 0.5, 0.2):
        assert saved_bytes(joint, budget, estimator="flops") <= torch_saved_bytes(joint, budget)


def test_budget_zero_saves_least(capture):
    # The seed answers budget 0 with "the inputs"; a small intermediate can be cheaper to save
    # than a big input, so ours takes whichever the backward reads fewer bytes of.
    from aot_partition.budget.search import needed_by_backward
    from aot_partition.fx.sizes import node_nbytes

    joint = joint_of("gpt", capture)
    module = joint.fresh()
    info = classify(module, joint.num_fwd_outputs)
    search = BudgetSearch.prepare(module.graph, info, solver="dp", estimator="flops")

    def read_bytes(saved):
        return sum(node_nbytes(n) for n in needed_by_backward(search, saved))

    at_zero = read_bytes(choose_saved_values_set(module.graph, info, 0.0))
    assert at_zero <= read_bytes(info.inputs)
    for budget in (0.1, 0.3, 0.5, 1.0):
        assert at_zero <= read_bytes(search.saved_values(budget)[0]), budget


def test_search_reports_memory_ratio_within_budget(capture):
    joint = joint_of("gpt", capture)
    module = joint.fresh()
    info = classify(module, joint.num_fwd_outputs)
    search = BudgetSearch.prepare(module.graph, info, solver="dp", estimator="flops")
    assert search.memory_ratio(search.runtime_optimal) == 1.0
    assert search.memory_ratio(info.inputs) == 0.0
    ratios = [search.memory_ratio(search.saved_values(b)[0]) for b in (0.9, 0.5, 0.1)]
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[-1] < 1.0


@pytest.mark.parametrize("budget", [1.5, -0.1])
def test_budget_outside_unit_interval_names_the_value(budget, capture):
    joint = joint_of("mlp", capture)
    module = joint.fresh()
    info = classify(module, joint.num_fwd_outputs)
    with pytest.raises(ValueError, match=f"between 0 and 1.*got {budget}"):
        choose_saved_values_set(module.graph, info, budget)
    with pytest.raises(ValueError, match=f"got {budget}"):
        partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                              memory_budget=budget)


def test_unknown_solver_and_estimator_list_valid_ones(capture):
    joint = joint_of("mlp", capture)
    module = joint.fresh()
    info = classify(module, joint.num_fwd_outputs)
    with pytest.raises(ValueError, match="Unknown memory-budget solver 'magic'; valid: dp, "
                                         "dp_graph, greedy, ilp, ilp_graph"):
        BudgetSearch.prepare(module.graph, info, solver="magic")
    with pytest.raises(ValueError, match="Unknown runtime estimator 'guess'; valid: flops"):
        BudgetSearch.prepare(module.graph, info, solver="dp", estimator="guess")


def test_solver_and_estimator_names_have_one_source():
    """The budget solvers are the knapsack solvers plus the graph-aware two; the flag
    declarations in aot_config and aot_pipeline's option list name the same ones."""
    from aot_config import functorch as flags
    from aot_partition.core.knapsack import KNAPSACK_SOLVERS
    from aot_partition.core.mincut import available_solver_names
    from aot_partition.costs.estimators import RUNTIME_ESTIMATORS
    from aot_pipeline import SOLVERS as PIPELINE_SOLVERS

    assert set(BUDGET_SOLVERS) == {*KNAPSACK_SOLVERS, "dp_graph", "ilp_graph"}
    declared = flags.flags()
    assert set(declared["activation_memory_budget_solver"].choices) == set(BUDGET_SOLVERS)
    assert set(PIPELINE_SOLVERS) == set(BUDGET_SOLVERS)
    assert set(declared["activation_memory_budget_runtime_estimator"].choices) == set(
        RUNTIME_ESTIMATORS)
    assert set(declared["min_cut_solver"].choices) == set(available_solver_names())


def test_testing_estimator_changes_nothing_at_full_budget(capture):
    joint = joint_of("gpt", capture)
    with functorch_config.patch(activation_memory_budget_runtime_estimator="testing"):
        assert saved_bytes(joint, 1.0) == torch_saved_bytes(joint, 1.0)
        assert saved_bytes(joint, 0.3) <= saved_bytes(joint, 1.0)


def test_torch_config_budget_is_honoured(capture):
    """torch's flag, set alone, is used (issue 27; see test_torch_flags.py)."""
    joint = joint_of("gpt", capture)
    full = saved_bytes(joint, None)
    with functorch_config.patch(activation_memory_budget=0.1):
        ours = saved_bytes(joint, None)
    with torch_config.patch(activation_memory_budget=0.1):
        assert saved_bytes(joint, None) == ours < full
    assert torch.is_tensor(torch.zeros(1))


def recompute_flops(joint, budget, solver):
    from aot_partition.costs.estimators import count_flops

    def flops(gm):
        return sum(f for n in gm.graph.nodes if n.op == "call_function"
                   for f in [count_flops(n)] if f > 1)

    # The flops estimator: the solvers then minimize what this test measures.
    with functorch_config.patch(activation_memory_budget_solver=solver,
                                activation_memory_budget_runtime_estimator="flops"):
        fw, bw, _ = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                          memory_budget=budget)
    return (saved_activation_bytes(fw, joint.num_fwd_outputs),
            flops(fw) + flops(bw) - flops(joint.module))


def test_ilp_graph_is_never_worse_than_dp_and_better_somewhere(capture):
    joint = joint_of("gpt", capture)
    strictly_better = False
    for budget in (0.8, 0.5, 0.2):
        dp_bytes, dp_flops = recompute_flops(joint, budget, "dp")
        ilp_bytes, ilp_flops = recompute_flops(joint, budget, "ilp_graph")
        assert ilp_bytes <= dp_bytes and ilp_flops <= dp_flops, (budget, ilp_bytes, dp_bytes)
        strictly_better |= ilp_bytes < dp_bytes or ilp_flops < dp_flops
    assert strictly_better


def test_only_batch_norm_reading_running_stats_is_kept_in_forward(capture):
    from aot_partition.fx.passes import save_readers_of_mutated_inputs
    from torch.utils.checkpoint import CheckpointPolicy

    case = make_case("convnet")
    joint = capture(case.module, *case.inputs)
    module = joint.module
    assert save_readers_of_mutated_inputs(module.graph)
    tagged = {n.name for n in module.graph.nodes
              if n.meta.get("recompute") == CheckpointPolicy.MUST_SAVE}
    # Both forward batch norms (their running stats are written back) and the increments of
    # num_batches_tracked (written back too, named by the output descriptors), not the
    # backward ones, and not the convolutions that read the (unmutated) weights.
    assert tagged == {"_native_batch_norm_legit_functional",
                      "_native_batch_norm_legit_functional_1", "add", "add_1"}
    with functorch_config.patch(activation_memory_budget=0.0):
        _, bw, _ = partition_with_report(capture(case.module, *case.inputs).module,
                                         num_fwd_outputs=joint.num_fwd_outputs)
    assert not [n for n in bw.graph.nodes if "legit_functional" in str(n.target)]
