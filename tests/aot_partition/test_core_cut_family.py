"""The cut family (core/cut_family.py) answers exactly what a fresh min cut answers: the same
saved set, cost and source side for every ban set, whether it reuses an earlier cut, solves a
network contracted between nested cuts, or solves the whole network. No torch."""

from __future__ import annotations

import random

import numpy as np
import pytest
from aot_partition.core import CoreGraph, CoreNode, cut_family
from aot_partition.core import budget as core_budget
from aot_partition.core.budget import partition_under_budget
from aot_partition.core.graph import ban_reasons, partition_banned
from aot_partition.core.rules import TORCH_DEFAULT_RULES
from aot_partition.errors import InfeasibleMinCutError
from jaxpr_graphs import random_step as _random_step
from jaxpr_graphs import transformer_step


@pytest.fixture
def always_family(monkeypatch):
    """The family on every network (it steps aside for the small ones by default)."""
    monkeypatch.setattr(cut_family, "takes_python_flow", lambda num_edges: False)


def _same(ours, fresh):
    assert ours.saved == fresh.saved
    assert ours.cost == fresh.cost
    assert np.array_equal(ours.cut.source_side, fresh.cut.source_side)
    assert ours.banned_at == fresh.banned_at


@pytest.mark.parametrize("priced_by_bytes", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_every_ban_set_gets_the_fresh_cut(always_family, seed, priced_by_bytes):
    """Random subsets, nested runs (a bisection's) and supersets of the graph's bans, in a
    random order, against ``partition_banned`` on each."""
    graph = _random_step(seed) if seed % 4 else transformer_step(layers=1)[0]
    rng = random.Random(seed)
    runtime_bans = {n.id: "runtime" for n in graph.nodes if n.forward and n.runtime > 0}
    base = ban_reasons(graph, bans=runtime_bans)
    keys = list(base)
    family = cut_family.CutFamily(graph, recompute_views=False, parameters_are_free=True,
                                  priced_by_bytes=priced_by_bytes)
    order = keys[:]
    rng.shuffle(order)
    sets = [keys, [], *(rng.sample(keys, rng.randint(0, len(keys))) for _ in range(10)),
            *(order[:m] for m in (len(order) // 2, len(order) // 4, 3 * len(order) // 4,
                                  len(order) // 8, len(order) // 2 + 1))]
    rng.shuffle(sets)
    for chosen in sets:
        banned = {i: base[i] for i in sorted(chosen)}
        _same(family.cut(banned), partition_banned(graph, banned, solver="scipy",
                                                   priced_by_bytes=priced_by_bytes))
    assert family.flows + family.reused == len(sets)


def test_an_infeasible_ban_set_raises_the_solvers_error(always_family):
    """Nothing solved yet knows the new bans are feasible: the whole network is checked, and
    the error is the solver's."""
    graph = CoreGraph((
        CoreNode("x", nbytes=16, category="input", forward=True),
        CoreNode("a", ("x",), nbytes=16, category="opaque", forward=True),
        CoreNode("g", nbytes=16, category="tangent", in_backward=True),
        CoreNode("ga", ("g", "a"), nbytes=16, in_backward=True, backward=True),
    ))
    banned = {1: "a front end's ban"}
    family = cut_family.CutFamily(graph, recompute_views=False, parameters_are_free=True,
                                  priced_by_bytes=False)
    family.cut({})  # feasible: known, but not a superset of the bans
    with pytest.raises(InfeasibleMinCutError) as ours:
        family.cut(banned)
    with pytest.raises(InfeasibleMinCutError) as fresh:
        partition_banned(graph, banned, solver="scipy")
    assert str(ours.value) == str(fresh.value)


def _answers(graph, **options):
    fractions = [i / 64 for i in range(65)]
    least = partition_under_budget(graph, fraction=0.0, **options).saved_bytes
    most = partition_under_budget(graph, fraction=1.0, **options).saved_bytes
    caps = [least + k * (most - least) // 9 for k in range(10)]
    return ([partition_under_budget(graph, fraction=f, **options).saved for f in fractions]
            + [partition_under_budget(graph, max_saved_bytes=c, **options).saved for c in caps])


@pytest.mark.parametrize("rules", [(), TORCH_DEFAULT_RULES])
def test_the_search_answers_the_same_with_and_without_the_family(monkeypatch, rules):
    plain = core_budget._Search._cut

    def fresh_cuts(self, banned, priced_by_bytes):
        return partition_banned(self.graph, banned, solver="scipy",
                                recompute_views=self.options["recompute_views"],
                                parameters_are_free=self.options["parameters_are_free"],
                                priced_by_bytes=priced_by_bytes)

    for seed in range(6):
        graph = _random_step(seed) if seed else transformer_step(layers=1)[0]
        monkeypatch.setattr(core_budget._Search, "_cut", fresh_cuts)
        expected = _answers(graph.__class__(graph.nodes), rules=rules)
        monkeypatch.setattr(core_budget._Search, "_cut", plain)
        monkeypatch.setattr(cut_family, "takes_python_flow", lambda num_edges: False)
        assert _answers(graph.__class__(graph.nodes), rules=rules) == expected, seed
        monkeypatch.undo()
