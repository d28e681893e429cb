"""A fraction budget's reference check (reference.py): at a fraction between 0 and 1 the cut of
our estimator (roofline) is kept only when it is no worse than torch's estimator's (flops) on the
simulated peak and the estimated step; else the flops cut is taken.

On the zoo GPT the two estimators choose different cuts at 0.4 and at 0.5: at 0.4 ours loses
(the check must fire), at 0.5 it wins (the check must keep it). Scores here are computed from
the partition's own graphs, independently of the check's bookkeeping.
"""

from __future__ import annotations

import pytest
import torch.fx as fx
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition
from aot_partition.budget.peak import SimulatedPeak
from aot_partition.config import PartitionConfig
from aot_partition.costs.cut_runtime import step_estimate
from aot_partition.memory_models import simulator as memory
from aot_partition.partitioners import partition_with_report
from zoo import assert_matches_eager, make_case


@pytest.fixture(scope="module")
def gpt_joint(capture):
    case = make_case("gpt")
    return capture(case.module, *case.inputs)


def partition(joint, budget: float, **config):
    fw, bw, report = partition_with_report(
        joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs, memory_budget=budget,
        config=PartitionConfig(**config))
    return fw, bw, report


def scores(fw: fx.GraphModule, bw: fx.GraphModule) -> tuple[int, float]:
    """(simulated peak, roofline estimate of every call) of the partition's final graphs."""
    peak = memory.simulate_partition(fw.graph, bw.graph).peak_bytes
    return peak, step_estimate(fw.graph, bw.graph, "roofline")


def saved_names(report) -> list[str]:
    return [d.name for d in report.saved]


def three_ways(joint, budget: float):
    """The partition without the check (roofline's cut), flops' and the checked one; the
    first two's scores; the unchecked cut is asserted to differ from flops'."""
    unchecked = partition(joint, budget, reference_estimator=None)
    flops = partition(joint, budget, runtime_estimator="flops")
    assert saved_names(unchecked[2]) != saved_names(flops[2])
    return (unchecked, flops, partition(joint, budget),
            scores(*unchecked[:2]), scores(*flops[:2]))


def test_check_takes_the_flops_cut_where_ours_is_worse(gpt_joint):
    _, (flops_fw, flops_bw, flops), (fw, bw, report), ours, theirs = three_ways(gpt_joint, 0.4)
    # Without the check, roofline's cut is worse on an axis.
    assert ours[0] > theirs[0] or ours[1] > theirs[1]
    # With it (the default), the answer is flops' cut, graph for graph.
    check = report.reference_check
    assert check is not None and not check.kept_ours and not check.same_cut
    assert (check.estimator, check.reference_estimator, check.chosen) == (
        "roofline", "flops", "flops")
    assert saved_names(report) == saved_names(flops)
    assert fw.code == flops_fw.code and bw.code == flops_bw.code
    # What it compared is what the graphs score: ours first, the reference second.
    scored = {s.label: s for s in check.scores}
    assert list(scored)[:2] == ["roofline", "flops"]
    assert scored["roofline"].peak_bytes == ours[0]
    assert scored["flops"].peak_bytes == theirs[0]
    assert scored["roofline"].step_runtime == pytest.approx(ours[1])
    assert scored["flops"].step_runtime == pytest.approx(theirs[1])
    assert report.format().splitlines()[1] == check.describe()
    assert check.describe().startswith(
        f"reference check: took the flops cut (roofline: peak {ours[0]} bytes, step ")
    assert "the flops cut (reference check)" in report.solver


def test_check_keeps_ours_where_it_is_no_worse(gpt_joint):
    (unchecked_fw, unchecked_bw, unchecked), _, (fw, bw, report), ours, theirs = three_ways(
        gpt_joint, 0.5)
    assert ours[0] <= theirs[0] and ours[1] <= theirs[1]
    assert ours != theirs
    check = report.reference_check
    assert check is not None and check.kept_ours and not check.same_cut
    assert saved_names(report) == saved_names(unchecked)
    assert fw.code == unchecked_fw.code and bw.code == unchecked_bw.code
    assert check.describe().startswith("reference check: took the roofline cut (roofline: ")


@pytest.mark.parametrize("budget", [0.0, 0.2, 0.4, 0.5, 0.8, 1.0])
def test_answer_is_never_worse_than_the_flops_cut(gpt_joint, budget):
    ours = scores(*partition(gpt_joint, budget)[:2])
    theirs = scores(*partition(gpt_joint, budget, runtime_estimator="flops")[:2])
    assert ours[0] <= theirs[0]
    assert ours[1] <= theirs[1] * (1 + 1e-9)


def count_simulations(monkeypatch) -> list[int]:
    calls = [0]
    measure = SimulatedPeak._measure

    def counting(self, saved):
        calls[0] += 1
        return measure(self, saved)

    monkeypatch.setattr(SimulatedPeak, "_measure", counting)
    return calls


@pytest.mark.parametrize(("budget", "config"), [
    (1.0, {}),                                  # no knapsack: the estimator does not matter
    (0.0, {}),                                  # recompute everything: neither does it
    (0.4, {"runtime_estimator": "flops"}),      # ours is the reference
    (0.4, {"reference_estimator": None}),       # switched off
    (0.4, {"memory_budget_bytes": 10**9}),      # a byte cap chooses, not the fraction
])
def test_no_check_where_it_does_not_apply(gpt_joint, monkeypatch, budget, config):
    calls = count_simulations(monkeypatch)
    _, _, report = partition(gpt_joint, budget, **config)
    assert report.reference_check is None
    assert calls[0] == 0
    assert "reference check" not in report.format()


def test_same_cut_costs_no_simulation(capture, monkeypatch):
    case = make_case("mlp")  # roofline and flops agree on it at every fraction
    joint = capture(case.module, *case.inputs)
    calls = count_simulations(monkeypatch)
    _, _, report = partition(joint, 0.5)
    assert report.reference_check is not None and report.reference_check.same_cut
    assert calls[0] == 0
    assert report.reference_check.describe() == (
        "reference check: the flops estimator chose the same cut")


def test_flag_reaches_the_config_and_is_validated():
    assert functorch_config.activation_memory_budget_reference_estimator == "flops"
    assert PartitionConfig().reference_estimator == "flops"
    with functorch_config.patch(activation_memory_budget_reference_estimator=None):
        assert PartitionConfig.from_flags().reference_estimator is None
    with pytest.raises(ValueError, match=r"activation_memory_budget_reference_estimator = "
                                         r"'bogus' is not valid"):
        functorch_config.activation_memory_budget_reference_estimator = "bogus"


@pytest.mark.parametrize(("name", "budget"), [("gpt", 0.4), ("gpt", 0.5), ("llama", 0.5)])
def test_checked_partition_matches_eager(name, budget, aot_with):
    with functorch_config.patch(activation_memory_budget=budget):
        assert_matches_eager(make_case(name), aot_with(min_cut_rematerialization_partition))


# ---- the "ilp_graph" candidate (small forwards, default "dp" solver) ---------------------------

@pytest.fixture(scope="module")
def llama_joint(capture):
    case = make_case("llama")  # 201 MILP forward nodes: under ILP_CANDIDATE_MAX_NODES
    return capture(case.module, *case.inputs)


def test_ilp_candidate_is_taken_where_it_beats_both(llama_joint):
    fw, bw, report = partition(llama_joint, 0.5, reference_ilp=True)
    check = report.reference_check
    assert check is not None and check.chosen == "roofline ilp_graph"
    assert report.solver == ("whole-graph MILP, dp budget, the roofline ilp_graph cut "
                             "(reference check)")
    scored = {s.label: s for s in check.scores}
    assert set(scored) == {"roofline", "flops", "roofline ilp_graph"}
    exact, reference = scored["roofline ilp_graph"], scored["flops"]
    assert exact.peak_bytes <= reference.peak_bytes
    assert exact.step_runtime <= reference.step_runtime
    assert exact.step_runtime < scored["roofline"].step_runtime
    # It is the "ilp_graph" solver's own answer (proven optimal, so the same at any limit).
    ilp_fw, ilp_bw, ilp = partition(llama_joint, 0.5, budget_solver="ilp_graph",
                                    reference_estimator=None)
    assert saved_names(report) == saved_names(ilp)
    assert fw.code == ilp_fw.code and bw.code == ilp_bw.code
    assert ilp.solver == "whole-graph MILP, ilp_graph budget"
    assert scores(fw, bw) == (exact.peak_bytes, pytest.approx(exact.step_runtime))


def spy_milp(monkeypatch, *, time_limited: bool = False) -> list[float | None]:
    """Record each MILP solve's time limit; optionally report every solve as stopped by it."""
    from dataclasses import replace

    from aot_partition.budget import search as budget

    limits: list[float | None] = []
    solve = budget.solve_save_or_recompute

    def spy(problem, **kwargs):
        limits.append(kwargs.get("time_limit_s"))
        answer = solve(problem, **kwargs)
        return replace(answer, time_limited=True) if time_limited and answer else answer

    monkeypatch.setattr(budget, "solve_save_or_recompute", spy)
    return limits


def test_ilp_candidate_runs_only_when_asked_for_and_on_small_forwards(llama_joint, monkeypatch):
    from aot_partition.budget import reference

    limits = spy_milp(monkeypatch)
    # Off by default: no MILP, the check compares roofline's and flops' cuts only.
    _, _, report = partition(llama_joint, 0.5)
    assert limits == []
    assert {s.label for s in report.reference_check.scores} == {"roofline", "flops"}
    partition(llama_joint, 0.5, reference_ilp=True)
    assert limits == [reference.ILP_CANDIDATE_TIME_LIMIT_S]
    # Not with another solver than "dp": the user's choice is not second-guessed.
    limits.clear()
    partition(llama_joint, 0.5, budget_solver="greedy", reference_ilp=True)
    assert limits == []
    monkeypatch.setattr(reference, "ILP_CANDIDATE_MAX_NODES", 200)  # one below this forward's
    _, _, report = partition(llama_joint, 0.5, reference_ilp=True)
    assert limits == []
    assert {s.label for s in report.reference_check.scores} == {"roofline", "flops"}


FRESH_PROCESS = r"""
import sys

from aot_compilers import nop
from aot_config import functorch as flags
from aot_partition import min_cut_rematerialization_partition
from functorch.compile import aot_module
from zoo import make_case

case = make_case("llama")
with flags.patch(activation_memory_budget=0.5,
                 activation_memory_budget_reference_ilp=sys.argv[1] == "on"):
    compiled = aot_module(case.module, fw_compiler=nop, bw_compiler=nop,
                          partition_fn=min_cut_rematerialization_partition)
    compiled(*case.inputs).sum().backward()
print("scipy.optimize" in sys.modules)
"""


@pytest.mark.parametrize(("flag", "imported"), [("off", "False"), ("on", "True")])
def test_a_cold_process_imports_scipy_optimize_only_for_the_ilp_candidate(flag, imported):
    # The candidate's cost in a cold compile is mostly that import (0.2 s of CPU).
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, flag], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [tests, os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == imported


def test_ilp_candidate_flag_reaches_the_partitioner():
    assert functorch_config.activation_memory_budget_reference_ilp is False
    assert PartitionConfig().reference_ilp is False
    with functorch_config.patch(activation_memory_budget_reference_ilp=True):
        assert PartitionConfig.from_flags().reference_ilp is True


def test_ilp_candidate_without_a_proven_optimum_is_dropped(llama_joint, monkeypatch):
    spy_milp(monkeypatch, time_limited=True)
    _, _, report = partition(llama_joint, 0.5, reference_ilp=True)
    assert {s.label for s in report.reference_check.scores} == {"roofline", "flops"}
    assert report.reference_check.chosen != "roofline ilp_graph"
