"""A cut simulated on its plan (memory.simulate_plan: the joint's own nodes, no copies) gives
the timeline of its extracted, finished graphs (what the partition returns), step for step.

The cuts are the ones a search measures (the reference check at two fractions, a peak cap),
the default split and "recompute everything". A random op both graphs run makes the passes
change the graphs (its RNG state is threaded through): the plan says so (None) and the
simulator prices the graphs instead.
"""

from __future__ import annotations

import pytest
from aot_partition.budget.peak import SimulatedPeak
from aot_partition.costs.cut_runtime import recompute_estimate, step_estimate
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.fx.cut import extract_cut, finish_cut, split_saved
from aot_partition.fx.extract import default_saved_values, plan_cut
from aot_partition.fx.joint import is_primal, is_random
from aot_partition.memory_models import simulator as memory
from aot_partition.partitioners import partition_with_report
from zoo import make_case

CASES = ("gpt", "llama", "convnet", "views", "dropout")


def _fields(timeline: memory.MemoryTimeline) -> tuple:
    steps = [(s.phase, s.node, s.op, s.allocated, s.freed, s.high_bytes, s.live_bytes,
              s.high_by_kind) for s in timeline.steps]
    live = sorted((b.name, b.nbytes, b.kind) for b in timeline.live_at_peak)
    return (timeline.peak_bytes, timeline.peak_step, timeline.baseline_bytes,
            timeline.parameter_bytes, timeline.saved_bytes, timeline.end_bytes,
            timeline.peak_expressions, steps, live)


OPTIONS = ({}, {"alignment": 512, "allocator": "cuda"},
           {"workspace": memory.split_op_workspace, "record_steps": False})


def _compare(module, num_fwd_outputs: int, saved: list) -> int:
    """How many of OPTIONS' timelines of the cut were compared (0: the plan declined)."""
    compared = 0
    for options in OPTIONS:
        plan_tl, graphs_tl = _plan_and_graphs(module, num_fwd_outputs, saved, **options)
        if plan_tl is None:  # a recomputed random op: test_recomputed_random_op_...
            continue
        assert _fields(plan_tl) == _fields(graphs_tl)
        compared += 1
    return compared


def _compare_measured_cuts(joint, monkeypatch) -> int:
    """Compares every cut the searches of a few partitions simulate, while the partition's
    joint is as they see it (merged common subexpressions)."""
    compared = [0]
    real = SimulatedPeak._eager_timeline

    def comparing(self, saved, scratch=True):
        compared[0] += _compare(self.joint_module, self.num_fwd_outputs, list(saved))
        return real(self, saved, scratch)

    monkeypatch.setattr(SimulatedPeak, "_eager_timeline", comparing)
    for budget in (0.3, 0.6):
        partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                              memory_budget=budget)
    fw, bw = _finished(joint.module, joint.num_fwd_outputs, _default(joint))
    peak = memory.simulate_partition(fw, bw).peak_bytes
    try:
        partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                              peak_bytes=int(peak * 0.97))
    except UnreachableMemoryBudgetError:  # the cuts were measured all the same
        pass
    monkeypatch.undo()
    return compared[0]


def _default(joint) -> list:
    values, syms = default_saved_values(joint.module, joint.num_fwd_outputs)
    return [*values, *syms]


def _finished(module, num_fwd_outputs: int, saved):
    cut = finish_cut(extract_cut(module, saved, num_fwd_outputs=num_fwd_outputs))
    return cut.fw, cut.bw


def _plan_and_graphs(module, num_fwd_outputs: int, saved, **options):
    syms, values = split_saved(saved)
    plan = plan_cut(module, values, syms, num_fwd_outputs=num_fwd_outputs)
    plan_tl = memory.simulate_plan(module.graph, plan, facts={}, **options)
    graphs_tl = memory.simulate_partition(*_finished(module, num_fwd_outputs, saved), **options)
    return plan_tl, graphs_tl


@pytest.mark.parametrize("name", CASES)
def test_plan_timeline_equals_the_finished_graphs(capture, monkeypatch, name):
    case = make_case(name)
    joint = capture(case.module, *case.inputs)
    compared = sum(_compare(joint.module, joint.num_fwd_outputs, saved)
                   for saved in (_default(joint),
                                 [n for n in joint.module.graph.nodes if is_primal(n)]))
    compared += _compare_measured_cuts(joint, monkeypatch)
    assert compared >= 2 * len(OPTIONS)


def test_recomputed_random_op_is_simulated_on_the_graphs(capture):
    case = make_case("dropout")
    joint = capture(case.module, *case.inputs)
    graph = joint.module.graph
    assert any(is_random(n) for n in graph.nodes)
    everything = [n for n in graph.nodes if is_primal(n)]  # dropout runs again in the backward
    plan_tl, graphs_tl = _plan_and_graphs(joint.module, joint.num_fwd_outputs, everything)
    assert plan_tl is None
    simulator = SimulatedPeak(joint.module, joint.num_fwd_outputs)
    assert simulator.of(everything).peak_bytes == graphs_tl.peak_bytes
    # The opposite case: the default split saves the mask; the plan is simulated.
    plan_tl, graphs_tl = _plan_and_graphs(joint.module, joint.num_fwd_outputs, _default(joint))
    assert plan_tl is not None and plan_tl.peak_bytes == graphs_tl.peak_bytes


def test_runtimes_from_the_plan_equal_the_extracted_graphs(capture):
    case = make_case("gpt")
    joint = capture(case.module, *case.inputs)
    saved = _default(joint)
    simulator = SimulatedPeak(joint.module, joint.num_fwd_outputs, estimator="roofline")
    cut = extract_cut(joint.module, saved, num_fwd_outputs=joint.num_fwd_outputs)
    assert simulator.runtimes(saved) == (
        recompute_estimate(cut.fw, cut.bw, "roofline"),
        step_estimate(cut.fw, cut.bw, "roofline"))
