"""Monotone budgets on the zoo (issue 51, item 2): each zoo model's joint as the core's budget
search sees it (``budget.search.core_budget_graph``: the adapter's description, the fx search's
runtime estimates on its knapsack items), swept over fractions, byte caps and peak caps: a larger
fraction or peak cap never recomputes more; no cap goes over itself, and none is refused where
a smaller one was met; a larger byte cap never recomputes more than the fraction at a smaller
cap's bytes (test_core_budget_monotone.py says why)."""

from __future__ import annotations

import pytest
from aot_partition.budget.search import BudgetSearch, core_budget_graph
from aot_partition.config import PartitionConfig
from aot_partition.core import partition_under_budget
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.fx.classify import classify
from aot_partition.fx.prepare import prepared_joint
from zoo import ZOO, make_case


def _sweep(graph, options, kind, values):
    found = []
    for value in values:
        try:
            answer = partition_under_budget(graph, **options, **{kind: value})
        except UnreachableMemoryBudgetError:
            assert not found, (kind, value)
            continue
        if kind == "max_saved_bytes":
            assert answer.saved_bytes <= value
        if kind == "max_peak_bytes":
            assert answer.peak_bytes <= value
        found.append(answer.recompute_runtime)
    return found


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_sweeps_are_monotone(name, capture):
    case = make_case(name)
    joint = capture(case.module, *case.inputs)
    module = joint.fresh()
    config = PartitionConfig()
    with prepared_joint(module, joint.num_fwd_outputs, config=config):
        info = classify(module, joint.num_fwd_outputs)
        search = BudgetSearch.prepare(module.graph, info, config=config)
        graph, options = core_budget_graph(search)
    least = partition_under_budget(graph, **options, fraction=0.0).saved_bytes
    optimal = partition_under_budget(graph, **options, fraction=1.0)
    most, peak = optimal.saved_bytes, optimal.peak_bytes
    sweeps = [_sweep(graph, options, "fraction", [i / 48 for i in range(49)]),
              _sweep(graph, options, "max_peak_bytes",
                     [int(peak * (0.7 + k * 0.35 / 30)) for k in range(31)])]
    for found in sweeps:
        assert found == sorted(found, reverse=True)
    caps = [int(least + k * (most * 1.05 - least) / 30) for k in range(31)]
    capped = _sweep(graph, options, "max_saved_bytes", caps)
    span = most - least
    for k, small in enumerate(caps[:len(capped) - 1] if len(capped) == len(caps) else []):
        fraction = min(1.0, max(0.0, (small - least) / span - 1e-9)) if span > 0 else 1.0
        pooled = partition_under_budget(graph, **options, fraction=fraction)
        if pooled.saved_bytes <= small:
            assert capped[k + 1] <= pooled.recompute_runtime, (name, small)
