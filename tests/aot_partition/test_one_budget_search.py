"""The fx path's budget search (budget/search.py) against the core's (core/budget.py) on the zoo.

``budget.search.core_budget_graph`` translates an fx search's joint into the core's terms (the
adapter's description, the runtime-optimal cut's rules, the search's runtime estimates on its
knapsack items); ``core_saved_values`` runs ``core.partition_under_budget`` on it with torch's
meaning of a fraction (``fraction_of="runtime_optimal"``). Each zoo model is answered by both at
5 fractions (1.0, 0.8, 0.5, 0.2, 0.0) and 2 byte caps (the runtime-optimal cut's bytes, and an
ample cap). What this proves equal, and what it shows differs (ARCHITECTURE.md, "Two budget
searches, and why"):

- equal: the runtime-optimal cut (fraction 1.0 in both meanings, and both caps), the knapsack
  items and their runtimes;
- different: the answers between the ends, where the fx path keeps torch's escalation and trusts
  the knapsack's cut (its saved sets are torch's: test_saved_sets_golden) while the core
  measures each candidate cut, and the byte measure the caps compare (the core counts each node's
  own bytes; the fx path each storage once, views of the inputs free).
"""

from __future__ import annotations

from typing import Any

import pytest
from aot_partition import core
from aot_partition.budget.caps import within_bytes
from aot_partition.budget.search import (
    BudgetSearch,
    core_budget_graph,
    core_saved_values,
    needed_by_backward,
)
from aot_partition.config import PartitionConfig
from aot_partition.core.budget import FRACTION_OF, _search
from aot_partition.fx.classify import classify
from aot_partition.fx.prepare import prepared_joint
from aot_partition.fx.sizes import saved_bytes
from zoo import ZOO, make_case

BUDGETS = (1.0, 0.8, 0.5, 0.2, 0.0)
AMPLE = 10**12
_ANSWERS: dict[str, dict[str, Any]] = {}


def _names(nodes) -> list[str]:
    return [n.name for n in nodes]


def answers(name: str, capture) -> dict[str, Any]:
    """Both searches' answers on zoo model ``name`` (computed once per model)."""
    if name in _ANSWERS:
        return _ANSWERS[name]
    case = make_case(name)
    joint = capture(case.module, *case.inputs)
    module = joint.fresh()
    config = PartitionConfig()
    with prepared_joint(module, joint.num_fwd_outputs, config=config):
        info = classify(module, joint.num_fwd_outputs)
        search = BudgetSearch.prepare(module.graph, info, config=config)

        def fx_bytes(saved):  # the fx path's one measure: what the backward reads
            return saved_bytes(needed_by_backward(search, saved))

        found: dict[str, Any] = {"fx": {}, "core": {}, "fx_bytes": {}, "core_runtime": {}}
        for budget in BUDGETS:
            fx_saved, _ = search.saved_values(budget)
            core_saved, answer = core_saved_values(search, fraction=budget,
                                                   fraction_of="runtime_optimal")
            found["fx"][budget] = _names(fx_saved)
            found["core"][budget] = _names(core_saved)
            found["fx_bytes"][budget] = (fx_bytes(fx_saved), fx_bytes(core_saved))
            found["core_runtime"][budget] = answer.recompute_runtime
        optimal_fx_bytes = fx_bytes(search.runtime_optimal)
        graph, options = core_budget_graph(search)
        core_optimal = core.partition_under_budget(graph, fraction=1.0, **options)
        found["caps"] = {}
        # Each path's measure of the runtime-optimal cut, and an ample cap.
        for label, fx_cap, core_cap in (("optimal", optimal_fx_bytes, core_optimal.saved_bytes),
                                        ("ample", AMPLE, AMPLE)):
            fx_cut = within_bytes(search, fx_cap)
            core_saved, _ = core_saved_values(search, max_saved_bytes=core_cap)
            found["caps"][label] = (_names(fx_cut.saved), _names(core_saved))
        found["optimal"] = _names(search.runtime_optimal)
        found["span_optimal"] = list(core_optimal.saved)
        found["fx_items"] = dict(zip(_names(search.candidates), search.item_runtimes()))
        core_search = _search(graph, {}, options["release"], "dp",
                              {"solver": "scipy", "recompute_views": options["recompute_views"],
                               "parameters_are_free": options["parameters_are_free"],
                               "rules": tuple(options["rules"]),
                               "max_dist_from_bw": options["max_dist_from_bw"]})
        index = graph.index
        found["core_items"] = {item: graph.nodes[index[item]].runtime
                               for item in core_search.items
                               if graph.nodes[index[item]].runtime > 0}
        found["optimal_fx_bytes"] = optimal_fx_bytes
        found["has_range"] = search.has_range
    _ANSWERS[name] = found
    return found


def test_both_fraction_meanings_are_named():
    assert FRACTION_OF == ("span", "runtime_optimal")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_translation_keeps_the_cut_and_the_knapsack_items(name, capture):
    """The core sees the fx search's runtime-optimal cut and its knapsack items, each at the
    runtime the fx search estimated (the bans the escalation lifts cost nothing)."""
    found = answers(name, capture)
    assert found["span_optimal"] == found["optimal"]
    assert found["core_items"] == pytest.approx(
        {item: runtime for item, runtime in found["fx_items"].items() if runtime > 0})


@pytest.mark.parametrize("name", sorted(ZOO))
def test_equal_answers_at_the_runtime_optimal_end_and_under_both_caps(name, capture):
    found = answers(name, capture)
    assert found["fx"][1.0] == found["core"][1.0] == found["optimal"]
    for label in ("optimal", "ample"):  # each path's measure of the optimal cut, ample
        fx_saved, core_saved = found["caps"][label]
        assert fx_saved == core_saved == found["optimal"], label


@pytest.mark.parametrize("name", sorted(ZOO))
def test_five_budgets(name, capture):
    """At every fraction both answers save no more than the runtime-optimal cut (the fx path's
    measure); the core's recomputes no less as the fraction falls."""
    found = answers(name, capture)
    runtimes = [found["core_runtime"][budget] for budget in BUDGETS]
    assert runtimes == sorted(runtimes)
    for budget in BUDGETS:
        fx_bytes, core_bytes = found["fx_bytes"][budget]
        assert fx_bytes <= found["optimal_fx_bytes"], budget
        assert core_bytes <= found["optimal_fx_bytes"], budget


def test_the_core_frees_on_the_dropout_net_what_the_fx_search_cannot(capture):
    """The dropout net's one knapsack item (the dropout, saved with its RNG state when
    recomputed) frees nothing in the fx measure: the fx path answers the runtime-optimal cut at
    every fraction. The core's cuts priced by bytes (issue 52, items 5 and 6) find less in its
    measure: at 0.8 and 0.5 the input primals_3 saved for its transpose t_2 (free in the fx
    measure, 1,024 bytes in the core's), recomputing nothing with a runtime; at 0.2 and 0.0 the
    linear layer and its relu recomputed from the inputs, the dropout's outputs kept (fewer
    bytes in both measures)."""
    found = answers("dropout", capture)
    compute_saved = ["primals_3", "primals_5", "getitem", "getitem_1", "detach_1"]
    everything = ["primals_1", "primals_2", "primals_3", "primals_5", "getitem", "getitem_1"]
    expected = {1.0: (found["optimal"], 576, 0.0), 0.8: (compute_saved, 576, 0.0),
                0.5: (compute_saved, 576, 0.0), 0.2: (everything, 320, 8e-08),
                0.0: (everything, 320, 8e-08)}
    for budget in BUDGETS:
        saved, fx_bytes_of_core, runtime = expected[budget]
        assert found["fx"][budget] == found["optimal"], budget
        assert found["core"][budget] == saved, budget
        assert found["fx_bytes"][budget] == (576, fx_bytes_of_core), budget
        assert found["core_runtime"][budget] == pytest.approx(runtime), budget


def test_the_searches_differ_between_the_ends(capture):
    """Why two searches stay (ARCHITECTURE.md): between the ends the fx path's escalation and
    knapsack (torch's answers) and the core's measured candidates choose other cuts. On the
    zoo GPT at 0.5 the fx path saves 17,408 bytes (its measure) and the core 28,288 (a cut
    that recomputes nothing with a runtime: in the core's measure, where a transposed weight
    costs its bytes, it fits). When this fails the searches agree here: update
    ARCHITECTURE.md."""
    found = answers("gpt", capture)
    assert found["fx"][0.5] != found["core"][0.5]
    assert found["fx"][0.0] != found["core"][0.0]
    assert found["fx_bytes"][0.5] == (17_408, 28_288) and found["core_runtime"][0.5] == 0.0
