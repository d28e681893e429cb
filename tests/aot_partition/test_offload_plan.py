"""The keep / recompute / offload planner: known plans on hand-built arrays, never worse than
"dp" on zoo joints, deterministic, monotone in a peak cap, and the unreachable peak's message."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
from aot_partition.budget.offload_plan import (
    MemoryBudget,
    choose_under_peak,
    measure_plan,
    offload_windows,
    parse_memory_budget,
    peak_candidates,
    plan_activations,
    plan_offload,
    plan_within_bytes,
)
from aot_partition.budget.search import BudgetSearch
from aot_partition.core.ilp_graph import SaveOrRecompute
from aot_partition.core.offload_milp import (
    KeepRecomputeOffload,
    evaluate_plan,
    least_saved_bytes,
    solve_keep_recompute_offload,
)
from aot_partition.costs import roofline
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.fx.classify import classify
from zoo import make_case

FAST = 1e3   # GB/s: every copy hides on the zoo's tiny tensors
SLOW = 1e-6  # GB/s: no copy hides


def two_values(exposed: list[float]) -> KeepRecomputeOffload:
    """Input x (40 B) -> v0 = matmul (100 B, runtime 100) -> v1 = relu (100 B, runtime 1); the
    backward reads v0 and v1; only x fits on the device. ``exposed``: each value's copy time
    not hidden (v0 lives long, so its copies hide better in a real graph)."""
    base = SaveOrRecompute(
        sizes=np.array([100.0, 100.0, 40.0]), runtimes=np.array([100.0, 1.0]),
        read_by_backward=np.array([True, True, False]), recomputable=np.array([True, True]),
        reads=[[2], [0]], capacity=40.0, estimator="testing")
    return KeepRecomputeOffload(base, np.array(exposed), np.array([1.0, 1.0]))


def test_expensive_value_is_offloaded_and_cheap_one_recomputed():
    answer = solve_keep_recompute_offload(two_values([5.0, 5.0]))
    assert answer is not None and answer.gap <= 0.01
    assert answer.offload.tolist() == [True, False]     # recomputing v0 costs 100 > 5
    assert answer.recompute.tolist() == [False, True]   # recomputing v1 costs 1 < 5
    assert answer.keep.tolist() == [False] and answer.saved_bytes == 0.0
    assert answer.runtime == 6.0


def test_nothing_is_offloaded_when_no_copy_hides():
    # The twin over a tiny link: every copy costs more than recomputing.
    answer = solve_keep_recompute_offload(two_values([1e6, 1e6]))
    assert answer is not None
    assert not answer.offload.any() and answer.recompute.tolist() == [True, True]
    assert answer.keep.tolist() == [True] and answer.runtime == 101.0
    # and a value that may not be offloaded (inf) never is
    answer = solve_keep_recompute_offload(two_values([math.inf, 5.0]))
    assert answer is not None and answer.offload.tolist() == [False, False]


def test_the_link_caps_the_copies():
    problem = two_values([0.0, 0.0])
    both = solve_keep_recompute_offload(problem)
    assert both is not None and both.offload.tolist() == [True, True] and both.runtime == 0.0
    one = solve_keep_recompute_offload(KeepRecomputeOffload(problem.base, problem.exposed_s,
                                                            problem.transfer_s, link_s=1.0))
    assert one is not None and one.offload.tolist() == [True, False] and one.runtime == 1.0


def test_a_reference_that_ties_is_kept_and_bad_problems_are_named():
    problem = two_values([5.0, 5.0])
    tie = evaluate_plan(problem, np.array([False, False]), np.array([True, False]))
    assert tie is not None and tie.runtime == 6.0
    found = solve_keep_recompute_offload(problem, reference=tie)
    assert found is not None and found.source == "reference"
    with pytest.raises(ValueError, match=r"exposed_s must have one entry per forward node \(2\)"):
        KeepRecomputeOffload(problem.base, np.array([1.0]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"offload MILP gap must be in \[0, 1\), got 2"):
        solve_keep_recompute_offload(problem, gap=2)


def search_of(name, capture):
    case = make_case(name)
    joint = capture(case.module, *case.inputs)
    info = classify(joint.module, joint.num_fwd_outputs)
    search = BudgetSearch.prepare(joint.module.graph, info, solver="dp", estimator="roofline")
    return joint, search


@pytest.mark.parametrize("name", ["gpt", "llama", "convnet", "views"])
def test_never_worse_than_dp(name, capture):
    _, search = search_of(name, capture)
    dp = BudgetSearch.prepare(search.joint_graph, search.node_info, solver="dp",
                              estimator="roofline")
    for fraction in (0.8, 0.5, 0.2):
        dp_saved = dp.saved_values(fraction)[0]
        dp_bytes = sum(n.meta["val"].nbytes for n in dp_saved if hasattr(n.meta["val"], "nbytes"))
        for bandwidth in (FAST, SLOW):
            plan = plan_activations(search, fraction, bandwidth_gbps=bandwidth, min_bytes=0)
            assert plan.reference_s is not None, (name, fraction)
            assert plan.runtime <= plan.reference_s * (1 + 1e-9) + 1e-15, (name, fraction)
            assert plan.device_bytes <= dp_bytes, (name, fraction)
            assert plan.gap <= 0.01


def test_offload_follows_the_bandwidth(capture):
    _, search = search_of("gpt", capture)
    fast = plan_activations(search, 0.0, bandwidth_gbps=FAST, min_bytes=0)
    slow = plan_activations(search, 0.0, bandwidth_gbps=SLOW, min_bytes=0)
    assert fast.offloaded and fast.exposed_s == 0.0
    assert not slow.offloaded and slow.exposed_s == 0.0
    assert fast.runtime < slow.runtime  # offloading replaced some recompute
    # below the size floor nothing is offloaded
    assert not plan_activations(search, 0.0, bandwidth_gbps=FAST).offloaded


def test_the_plan_is_deterministic(capture):
    plans = []
    for _ in range(2):
        _, search = search_of("llama", capture)
        plan = plan_activations(search, 0.5, bandwidth_gbps=FAST, min_bytes=0)
        plans.append(([n.name for n in plan.kept], [n.name for n in plan.offloaded]))
    assert plans[0] == plans[1]


def test_plan_offload_takes_hidden_copies_only(capture):
    joint, search = search_of("gpt", capture)
    saved = search.runtime_optimal
    windows = offload_windows(joint.module.graph, saved)
    names = plan_offload(joint.module.graph, saved, None, bandwidth_gbps=FAST, min_bytes=0)
    assert names and set(names) <= {n.name for n in windows}
    assert plan_offload(joint.module.graph, saved, None, bandwidth_gbps=SLOW, min_bytes=0) == []
    # the config's bandwidth (the flag) is read when no argument is given
    config = SimpleNamespace(offload_bandwidth_gbps=FAST)
    assert plan_offload(joint.module.graph, saved, config, min_bytes=0) == names
    assert plan_offload(joint.module.graph, saved, config) == []  # zoo tensors < 1 MiB


def test_the_planner_reads_the_one_host_link(capture):
    """The planner times copies with fx/offload.py's link: the flag's value, else the table's
    (the CPU: its memory bandwidth), and a bad value names the real flag."""
    joint, search = search_of("gpt", capture)
    saved = search.runtime_optimal
    cpu_link = roofline.CONSERVATIVE_CPU.bandwidth / 1e9
    table = plan_offload(joint.module.graph, saved, SimpleNamespace(offload_bandwidth_gbps=None),
                         min_bytes=0)
    assert table == plan_offload(joint.module.graph, saved, None, bandwidth_gbps=cpu_link,
                                 min_bytes=0)
    for bad in (0, -1.0, True):
        with pytest.raises(ValueError, match=r"activation_offload_cpu_gpu_bw must be a "
                                             r"positive, finite number of GB/s"):
            plan_offload(joint.module.graph, saved, SimpleNamespace(offload_bandwidth_gbps=bad))


@pytest.fixture(scope="module")
def gpt_candidates(capture):
    joint, search = search_of("gpt", capture)
    return peak_candidates(search, joint.module, joint.num_fwd_outputs, bandwidth_gbps=FAST,
                           min_bytes=0, fractions=(1.0, 0.5, 0.25, 0.0))


def test_monotone_over_a_sweep_of_peaks(gpt_candidates):
    peaks = sorted({c.peak_bytes for c in gpt_candidates})
    caps = sorted({*peaks, *(p + 100 for p in peaks), max(peaks) * 2})
    chosen = [choose_under_peak(gpt_candidates, cap) for cap in caps]
    for cap, plan in zip(caps, chosen, strict=True):
        assert plan.peak_bytes <= cap
    steps = [plan.step_s for plan in chosen]
    assert steps == sorted(steps, reverse=True)  # a higher cap is never slower
    assert any(c.plan.offloaded for c in gpt_candidates)
    # offloading lowers the least reachable peak below keep/recompute's
    no_offload = min(c.peak_bytes for c in gpt_candidates if not c.plan.offloaded)
    assert min(peaks) < no_offload


def test_an_unreachable_peak_names_the_least(gpt_candidates):
    least = min(gpt_candidates, key=lambda c: c.peak_bytes)
    cap = least.peak_bytes - 1
    message = (f"simulated memory peak cap {cap} bytes is unreachable: the least this graph can "
               f"peak at is {least.peak_bytes} bytes ({least.plan.label})")
    with pytest.raises(UnreachableMemoryBudgetError) as raised:
        choose_under_peak(gpt_candidates, cap)
    assert str(raised.value) == message
    assert choose_under_peak(gpt_candidates, least.peak_bytes).peak_bytes == least.peak_bytes


def test_parse_memory_budget():
    assert parse_memory_budget("20GiB peak") == MemoryBudget(peak_bytes=20 * 2**30)
    assert parse_memory_budget("300MiB") == MemoryBudget(nbytes=300 * 2**20)
    assert parse_memory_budget(0.5) == MemoryBudget(fraction=0.5)
    for bad in ("20 apples peak", "0.5 peak", "lots", -1):
        with pytest.raises(ValueError, match=r"memory budget must be a fraction in \[0, 1\], a "
                                             r"byte cap .* or a peak cap \('20GiB peak'\)"):
            parse_memory_budget(bad)


def test_a_byte_cap_is_met_or_named_unreachable(capture):
    _, search = search_of("gpt", capture)
    least = plan_activations(search, 0.0, bandwidth_gbps=FAST, min_bytes=0)
    full = plan_activations(search, 1.0, bandwidth_gbps=FAST, min_bytes=0)
    previous = None
    for nbytes in sorted({int(least.device_bytes), int(full.device_bytes),
                          int((least.device_bytes + full.device_bytes) / 2)}, reverse=True):
        plan = plan_within_bytes(search, nbytes, bandwidth_gbps=FAST, min_bytes=0)
        assert plan.device_bytes <= nbytes and plan.gap <= 0.01
        assert plan.reference_s is None or plan.runtime <= plan.reference_s * (1 + 1e-9)
        if previous is not None:  # less room never makes the plan faster, up to the gap
            assert plan.runtime >= previous.runtime * (1 - 0.02)
        previous = plan
    fewest = least_saved_bytes(plan_problem(search))
    assert fewest is not None and fewest <= least.device_bytes
    cap = int(fewest) - 1
    with pytest.raises(UnreachableMemoryBudgetError) as raised:
        plan_within_bytes(search, cap, bandwidth_gbps=FAST, min_bytes=0)
    assert str(raised.value) == (
        f"activation memory budget {cap} bytes is unreachable: the least this graph can save "
        f"is {int(fewest)} bytes (least-bytes plan)")
    assert plan_within_bytes(search, int(fewest), bandwidth_gbps=FAST,
                             min_bytes=0).device_bytes == fewest


def plan_problem(search):
    from aot_partition.budget.offload_plan import _planning

    return _planning(search.with_estimator("roofline"), True, FAST, 0).problem


def test_offloaded_values_leave_the_device_over_their_window(capture):
    """measure_plan simulates the graphs the mechanism rewrites (memory_models/simulator.py's accounting):
    the offload plan's peak is no higher than the same saved set kept, and its transfers are
    the plan's offloaded values."""
    joint, search = search_of("gpt", capture)
    plan = plan_activations(search, 0.5, bandwidth_gbps=FAST, min_bytes=0)
    assert plan.offloaded
    kept = dataclasses.replace(plan, kept=tuple(plan.saved), offloaded=())
    moved = measure_plan(plan, joint.module, joint.num_fwd_outputs, bandwidth_gbps=FAST)
    still = measure_plan(kept, joint.module, joint.num_fwd_outputs, bandwidth_gbps=FAST)
    assert moved.peak_bytes <= still.peak_bytes
    assert not still.timeline.transfers
    assert {t.value for t in moved.timeline.transfers} == {n.name for n in plan.offloaded}
    assert moved.timeline.offloaded_bytes == sum(n.meta["val"].nbytes for n in plan.offloaded)
