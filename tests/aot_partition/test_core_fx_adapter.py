"""The fx path is one adapter onto the graph-agnostic core, and decides what it decided before.

``data/core_golden.json`` holds the saved nodes, saved bytes and bans of every zoo model at
budgets 1.0 / 0.5 / 0.0 as the code of git rev 4bf4f02 (before the core) decided them, with the
tie-break between equal cuts made networkx's (torch's) in issue 16 (the same bytes, other
nodes); see ``data/make_core_golden.py`` for how it was made and how to regenerate it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import core
from aot_partition.config import MinCutOptions, PartitionConfig
from aot_partition.fx.classify import classify, default_op_types
from aot_partition.fx.network import describe, fx_core_graph
from aot_partition.fx.passes.recompute_tags import must_recompute
from aot_partition.fx.policy import PolicyContext, can_be_banned
from aot_partition.fx.prepare import prepared_joint
from aot_partition.fx.solve import solve_min_cut_detailed
from aot_partition.partitioners import partition_with_report
from zoo import ZOO, make_case

GOLDEN = json.loads((Path(__file__).parent / "data" / "core_golden.json").read_text())
BUDGETS = ("1.0", "0.5", "0.0")
# The torch the golden was traced with (the lock's): other releases trace the zoo into other
# graphs (node names, decompositions), so the names cannot match there. The check that the
# adapter's description gives the same cut as the solver runs on every release.
GOLDEN_TORCH = "2.13"


def _joint(capture, name):
    case = make_case(name)
    inputs = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in case.inputs)
    return capture(case.module, *inputs)


def test_golden_covers_the_zoo():
    assert sorted(GOLDEN) == sorted(ZOO)
    assert all(sorted(GOLDEN[name]) == sorted(BUDGETS) for name in GOLDEN)


@pytest.mark.skipif(not torch.__version__.startswith(GOLDEN_TORCH + "."),
                    reason=f"the golden decisions were traced with torch {GOLDEN_TORCH}")
@pytest.mark.parametrize("name", sorted(ZOO))
def test_fx_adapter_decides_as_before(name, capture):
    joint = _joint(capture, name)
    for budget in BUDGETS:
        # The golden was recorded under the "flops" estimator (the default until issue 16).
        with functorch_config.patch(activation_memory_budget_runtime_estimator="flops"):
            _, _, report = partition_with_report(
                joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs, memory_budget=float(budget))
        want = GOLDEN[name][budget]
        got = {"saved": [d.name for d in report.saved], "saved_bytes": report.saved_bytes,
               "banned": dict(report.banned)}
        assert got == want, (name, budget)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_description_fed_to_core_gives_the_same_cut(name, capture):
    """The adapter's description, bans written in, through ``core.partition`` directly."""
    joint = _joint(capture, name)
    module = joint.fresh()
    config = PartitionConfig()
    with prepared_joint(module, joint.num_fwd_outputs):
        info = classify(module, joint.num_fwd_outputs)
        options = MinCutOptions()
        solution = solve_min_cut_detailed(module.graph, info, options, config=config)
        ctx = PolicyContext.create(default_op_types(), info, options, config)
        graph = fx_core_graph(module.graph, ctx)
    assert all("." not in n.id for n in graph.nodes)  # plain data: ids, not fx nodes
    result = core.partition(graph, recompute_views=config.recompute_views,
                            parameters_are_free=config.treat_parameters_as_free_to_save)
    assert result.saved == tuple(n.name for n in solution.saved_values)
    assert result.cost == solution.core.cost
    assert result.banned == {n.name: why for n, why in solution.banned.items()}
    kinds = {d.kind for d in result.decisions.values()}
    assert kinds <= {"saved", "recomputed", "backward", "forward"} and "saved" in kinds


@pytest.mark.parametrize("name", sorted(ZOO))
def test_description_inlines_the_policy_checks(name, capture):
    """``describe`` inlines ``can_be_banned`` and ``must_recompute`` per node (it runs once per
    joint node); the inlined answers are the policy's, node for node (checkpoint-annotated
    joints: test_partition_checkpoint)."""
    joint = _joint(capture, name)
    module = joint.fresh()
    config = PartitionConfig()
    with prepared_joint(module, joint.num_fwd_outputs):
        info = classify(module, joint.num_fwd_outputs)
        ctx = PolicyContext.create(default_op_types(), info, MinCutOptions(), config)
        desc = describe(module.graph, ctx)
        for fx_node, node in zip(desc.nodes, desc.graph.nodes):
            assert (fx_node in desc.exempt) == (not can_be_banned(fx_node, ctx, ())), fx_node
            assert node.must_recompute == (must_recompute(fx_node)
                                           and fx_node not in info.tangents_closure), fx_node
            assert node.inputs == tuple(a.name for a in fx_node.all_input_nodes)
