"""One cost model, one set of checks, one vocabulary: the fx partitioner and the core, called
directly on the core graph the fx adapter builds (``fx.network.core_graph_of``), save the same
values for the same reasons on every zoo model.

Budget 1.0 only: below it the fx path releases bans by a knapsack over its own runtime
estimates, a search the core alone does not run (the core's budgets are another module's).
"""

from __future__ import annotations

import pytest
from aot_partition.config import PartitionConfig
from aot_partition.core import CoreGraphError, ban_reasons, partition
from aot_partition.fx.classify import classify
from aot_partition.fx.network import core_graph_of
from aot_partition.fx.prepare import prepared_joint
from aot_partition.fx.solve import solve_min_cut_detailed
from aot_partition.partitioners import partition_with_report
from core_graphs import mlp
from zoo import ZOO, make_case


def _joint(capture, name):
    case = make_case(name)
    inputs = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in case.inputs)
    return capture(case.module, *inputs)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_fx_path_and_core_agree(name, capture):
    joint = _joint(capture, name)
    config = PartitionConfig.from_flags()
    call = core_graph_of(joint.fresh(), joint.num_fwd_outputs, config=config)
    core = call.partition(config.min_cut_solver)

    # The partitioner: its saved values and its bans, node by node.
    _, _, report = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                         memory_budget=1.0, config=config)
    ids = {n.id for n in call.graph.nodes}
    assert {d.name for d in report.saved if d.name in ids} == set(core.saved), name
    assert report.banned == core.banned, name

    # Its min cut: the same decision and reason string for every node.
    module = joint.fresh()
    with prepared_joint(module, joint.num_fwd_outputs, config=config):
        info = classify(module, joint.num_fwd_outputs)
        solution = solve_min_cut_detailed(module.graph, info, config.options,
                                          config=config)
    fx_reasons = {i: (d.kind, d.reason) for i, d in solution.core.decisions.items()}
    assert fx_reasons == {i: (d.kind, d.reason) for i, d in core.decisions.items()}, name
    assert solution.core.cost == core.cost
    # The bans alone (what budget 0 asks of step 3): the same reasons in the same order.
    options = call.options
    alone = ban_reasons(call.graph, rules=options["rules"], release=options["release"],
                        max_dist_from_bw=options["max_dist_from_bw"])
    assert list(alone.items()) == list(core.banned_at.items()), name


def test_ban_reasons_checks_its_options_as_partition_does():
    graph = mlp()
    for bad in ({"rules": ("no_such_rule",)}, {"release": ("nope",)},
                {"max_dist_from_bw": -1}):
        with pytest.raises(CoreGraphError) as from_partition:
            partition(graph, **bad)
        with pytest.raises(CoreGraphError) as from_bans:
            ban_reasons(graph, **bad)
        assert str(from_bans.value) == str(from_partition.value)
    assert ban_reasons(graph, rules=("compute_intensive",)) == partition(
        graph, rules=("compute_intensive",)).banned_at == {
            0: "primal input", 1: "primal input", 2: "compute-intensive op: compute"}
