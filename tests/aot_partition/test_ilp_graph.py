"""The "ilp_graph" whole-graph MILP: known optima on hand-built arrays, the time limit, the
reference answer it must never lose to, and zoo joints where it is never worse than "dp"."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
from aot_config import functorch as functorch_config
from aot_partition import explain_partition
from aot_partition.core import ilp_graph
from aot_partition.core.ilp_graph import (
    SaveOrRecompute,
    evaluate,
    fits,
    solve_save_or_recompute,
)
from aot_partition.costs import estimators
from aot_partition.costs.estimators import estimate_runtime


def chain(capacity: float, **overrides) -> SaveOrRecompute:
    """Input x (40 bytes) -> v0 (100 B, runtime 10) -> v1 (100 B, 1) -> v2 (10 B, 5); the
    backward reads v1 and v2. Optima by capacity (bytes: saved nodes + kept inputs):
    >= 110 save v1, v2 (runtime 0); 100 save v1, recompute v2 (5); 50 save v2, keep x,
    recompute v0, v1 (11); 40 keep x, recompute all (16); below 40 infeasible."""
    fields = dict(
        sizes=np.array([100.0, 100.0, 10.0, 40.0]),
        runtimes=np.array([10.0, 1.0, 5.0]),
        read_by_backward=np.array([False, True, True, False]),
        recomputable=np.array([True, True, True]),
        reads=[[3], [0], [1]],
        capacity=capacity,
        estimator="testing",
    )
    fields.update(overrides)
    return SaveOrRecompute(**fields)


@pytest.mark.parametrize(("capacity", "save", "keep", "runtime", "nbytes"), [
    (200, [False, True, True], [False], 0.0, 110.0),
    (100, [False, True, False], [False], 5.0, 100.0),
    (60, [False, False, True], [True], 11.0, 50.0),
    (45, [False, False, False], [True], 16.0, 40.0),
])
def test_known_optimum(capacity, save, keep, runtime, nbytes):
    answer = solve_save_or_recompute(chain(capacity))
    assert answer is not None and answer.source == "milp"
    assert answer.save.tolist() == save and answer.keep.tolist() == keep
    assert answer.runtime == runtime and answer.saved_bytes == nbytes
    assert float(np.array([10.0, 1.0, 5.0])[answer.recompute].sum()) == runtime
    assert not answer.time_limited and answer.mip_gap is not None and answer.mip_gap <= 1e-6


def test_infeasible_capacity_gives_none():
    assert solve_save_or_recompute(chain(30)) is None


def test_unsavable_and_unrecomputable_nodes():
    # v1 cannot be saved (a tuple-valued node): at capacity 100 save v0 and recompute the rest.
    answer = solve_save_or_recompute(chain(100, savable=np.array([True, False, True])))
    assert answer is not None
    assert answer.save.tolist() == [True, False, False] and answer.runtime == 6.0
    # v0 may not be recomputed: at capacity 60 nothing fits any more.
    assert solve_save_or_recompute(chain(60, recomputable=np.array([False, True, True]))) is None


def test_evaluate_recomputes_the_least_the_saved_set_needs():
    problem = chain(1000)
    answer = evaluate(problem, np.array([False, False, True]))
    assert answer is not None
    assert answer.recompute.tolist() == [True, True, False] and answer.keep.tolist() == [True]
    assert answer.runtime == 11.0 and answer.saved_bytes == 50.0
    # an input the recomputation needs but that is not kept: not a valid answer
    assert evaluate(problem, np.array([False, False, True]), np.array([False])) is None
    banned = chain(1000, recomputable=np.array([False, True, True]))
    assert evaluate(banned, np.array([False, False, True])) is None
    assert not fits(chain(40), answer) and fits(chain(50), answer)


def test_a_reference_that_ties_or_wins_is_kept(monkeypatch):
    problem = chain(100)
    optimum = evaluate(problem, np.array([False, True, False]))
    assert optimum is not None
    tie = solve_save_or_recompute(problem, reference=optimum)
    assert tie is not None and tie.source == "reference" and tie.runtime == 5.0
    assert tie.status  # the MILP's status is still reported
    # a worse reference loses
    worse = evaluate(problem, np.array([False, False, False]))
    assert worse is not None
    found = solve_save_or_recompute(problem, reference=worse)
    assert found is not None and found.source == "milp" and found.runtime == 5.0
    # a reference over the capacity never wins
    over = evaluate(problem, np.array([False, True, True]))
    assert over is not None and not fits(problem, over)
    found = solve_save_or_recompute(problem, reference=over)
    assert found is not None and found.source == "milp"
    # when HiGHS finds nothing (or something worse), the reference is the answer
    monkeypatch.setattr(ilp_graph, "_solve_milp", lambda problem, limit, deterministic: None)
    found = solve_save_or_recompute(problem, reference=worse)
    assert found is not None and found.source == "reference" and found.runtime == 16.0
    assert solve_save_or_recompute(problem) is None


def layered(num_layers: int, width: int, capacity_ratio: float, seed: int = 0
            ) -> SaveOrRecompute:
    """A random layered DAG: each node reads two nodes of the layer before; the backward reads
    a random half of the nodes; one graph input feeds the first layer."""
    rng = np.random.default_rng(seed)
    n = num_layers * width
    reads: list[list[int]] = []
    for layer in range(num_layers):
        for _ in range(width):
            if layer == 0:
                reads.append([n])
            else:
                base = (layer - 1) * width
                reads.append(sorted({base + int(i) for i in rng.integers(0, width, size=2)}))
    sizes = np.concatenate([rng.integers(1, 1000, size=n).astype(float), [500.0]])
    read_by_backward = np.concatenate([rng.random(n) < 0.5, [False]])
    return SaveOrRecompute(
        sizes=sizes, runtimes=rng.integers(1, 100, size=n).astype(float),
        read_by_backward=read_by_backward, recomputable=rng.random(n) < 0.9, reads=reads,
        capacity=capacity_ratio * float(sizes[:n][read_by_backward[:n]].sum()),
        estimator="testing")


def test_tiny_time_limit_gives_a_checked_answer_or_none():
    problem = layered(60, 50, 0.3)
    answer = solve_save_or_recompute(problem, time_limit_s=1e-3)
    if answer is not None:
        assert fits(problem, answer)
        checked = evaluate(problem, answer.save, answer.keep)
        assert checked is not None and checked.runtime == answer.runtime
        assert answer.mip_gap is not None and answer.status
        assert answer.time_limited or answer.mip_gap <= 1e-6


def test_time_limit_reaches_highs_and_is_validated(monkeypatch):
    seen = []
    real_milp = scipy.optimize.milp

    def spy(*args, **kwargs):
        seen.append(kwargs["options"]["time_limit"])
        return real_milp(*args, **kwargs)

    monkeypatch.setattr(scipy.optimize, "milp", spy)
    solve_save_or_recompute(chain(100), time_limit_s=2.5)
    monkeypatch.setattr(ilp_graph, "ILP_GRAPH_TIME_LIMIT_S", 7.0)  # read at call time
    solve_save_or_recompute(chain(100))
    assert seen == [2.5, 7.0]
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="time limit must be a positive number"):
            solve_save_or_recompute(chain(100), time_limit_s=bad)


# ---- zoo joints: never worse than dp --------------------------------------------------------

def recompute_cost(joint, budget: float, solver: str, estimator: str) -> tuple[int, float]:
    """(saved bytes on the budget search's scale, estimated runtime of every recomputed node) of
    one partition's report. The MILP's "no more than dp" is on that scale (each saved tensor's
    bytes, torch's), not on the report's one measure (views of inputs free, bases once)."""
    # The solvers compared as they are: no reference check (it could swap in flops' cut).
    with functorch_config.patch(activation_memory_budget_solver=solver,
                                activation_memory_budget_runtime_estimator=estimator,
                                activation_memory_budget_reference_estimator=None):
        report = explain_partition(joint.fresh(), joint.inputs,
                                   num_fwd_outputs=joint.num_fwd_outputs, memory_budget=budget)
    nodes = {n.name: n for n in joint.module.graph.nodes}
    runtimes = [estimate_runtime(nodes[d.name], estimator) for d in report.recomputed]
    # the MILP's convention for "flops": ops without a FLOP formula (estimate 1) are free
    saved = sum(d.nbytes for d in report.saved)
    return saved, sum(r for r in runtimes if estimator != "flops" or r > 1)


@pytest.mark.parametrize("estimator", ["flops", "roofline"])
@pytest.mark.parametrize("name", ["mlp", "gpt", "llama", "gpt_sdpa", "views"])
def test_zoo_ilp_graph_never_worse_than_dp(name, estimator, capture):
    from zoo import make_case

    estimators.clear_runtime_cache()
    case = make_case(name)
    joint = capture(case.module, *case.inputs)
    for budget in (0.2, 0.5, 0.8):
        dp_bytes, dp_runtime = recompute_cost(joint, budget, "dp", estimator)
        ilp_bytes, ilp_runtime = recompute_cost(joint, budget, "ilp_graph", estimator)
        assert ilp_bytes <= dp_bytes, (budget, ilp_bytes, dp_bytes)
        assert ilp_runtime <= dp_runtime * (1 + 1e-9), (budget, ilp_runtime, dp_runtime)
