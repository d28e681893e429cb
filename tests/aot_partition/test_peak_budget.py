"""A cap on the simulated forward+backward peak (``activation_memory_peak_bytes``): ample caps
change nothing, caps hold, monotone, clear errors, gradients equal eager's, and no simulation
without the cap."""

from __future__ import annotations

import aot_partition.memory_models.simulator as memory
import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import explain_partition, min_cut_rematerialization_partition
from aot_partition.budget.peak import SimulatedPeak
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.memory_models.simulator import simulate_partition
from aot_partition.partitioners import partition_with_report
from functorch.compile import aot_module, make_boxed_func
from torch import nn
from zoo import assert_matches_eager, make_case


@pytest.fixture(scope="module")
def gpt(capture):
    case = make_case("gpt")
    return capture(case.module, *case.inputs)


@pytest.fixture
def count_simulations(monkeypatch):
    """Counts simulations (memory.simulate_plan on a cut's plan, memory.simulate_partition
    on graphs where a plan cannot be simulated: what SimulatedPeak calls); returns the list."""
    calls = []
    for name in ("simulate_partition", "simulate_plan"):
        real = getattr(memory, name)

        def counting(*args, _real=real, **kwargs):
            timeline = _real(*args, **kwargs)
            if timeline is not None:  # simulate_plan's None: simulate_partition runs instead
                calls.append(1)
            return timeline

        monkeypatch.setattr(memory, name, counting)
    return calls


def _partition(joint, peak=None, **kwargs):
    """(simulated peak of the graphs returned, report) under a peak cap."""
    fw, bw, report = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                           peak_bytes=peak, **kwargs)
    return simulate_partition(fw, bw).peak_bytes, report


def _least(joint, **kwargs):
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        _partition(joint, 0, **kwargs)
    return info.value.least


def _saved_names(report):
    return [d.name for d in report.saved]


def test_ample_cap_gives_the_full_budget_answer_with_one_simulation(gpt, count_simulations):
    full_peak, full = _partition(gpt)
    assert full.peak_bytes is None and full.simulated_peak_bytes is None
    for cap in (full_peak, 10**12):
        count_simulations.clear()
        peak, report = _partition(gpt, cap)
        assert count_simulations == [1]  # the runtime-optimal cut, once
        assert _saved_names(report) == _saved_names(full)
        assert report.peak_bytes == cap and report.simulated_peak_bytes == peak == full_peak
        assert "peak cap" in report.format()


def test_cap_between_holds_and_the_report_records_the_simulated_peak(gpt):
    full_peak, _ = _partition(gpt)
    least = _least(gpt)
    assert least < full_peak
    cap = (least + full_peak) // 2
    peak, report = _partition(gpt, cap)
    assert least <= peak <= cap < full_peak
    assert report.simulated_peak_bytes == peak


@pytest.mark.slow
def test_peaks_never_grow_as_the_cap_falls(gpt):
    full_peak, _ = _partition(gpt)
    least = _least(gpt)
    caps = [full_peak - (full_peak - least) * i // 10 for i in range(11)]
    answers = [_partition(gpt, cap) for cap in caps]
    peaks = [peak for peak, _ in answers]
    assert peaks == sorted(peaks, reverse=True), peaks
    assert all(peak <= cap for peak, cap in zip(peaks, caps))
    assert peaks[0] == full_peak and peaks[-1] == least
    for (high_peak, high), cap, (_, low) in zip(answers, caps[1:], answers[1:]):
        if high_peak <= cap:  # a higher cap's answer that fits stays the answer
            assert _saved_names(low) == _saved_names(high)


def test_unreachable_cap_names_the_cap_and_the_least_simulated_peak(gpt):
    least = _least(gpt)
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        explain_partition(gpt.module, gpt.inputs, num_fwd_outputs=gpt.num_fwd_outputs,
                          peak_bytes=least - 1)
    label = info.value.least_label
    assert str(info.value) == (f"simulated memory peak cap {least - 1} bytes is unreachable: the "
                               f"least this graph can peak at is {least} bytes ({label})")
    assert isinstance(info.value, ValueError)
    assert (info.value.cap, info.value.least) == (least - 1, least)
    assert _partition(gpt, least)[0] == least


@pytest.mark.parametrize("cap", [-1, 1.5, True])
def test_a_cap_that_is_not_a_byte_count_is_a_value_error(gpt, cap):
    with pytest.raises(ValueError, match=f"activation memory peak in bytes must be an int >= 0; "
                                         f"got {cap!r}"):
        _partition(gpt, cap)


def test_no_simulation_without_a_peak_cap(gpt, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("simulated without a peak cap")

    monkeypatch.setattr(memory, "simulate_partition", forbidden)
    monkeypatch.setattr(memory, "simulate_plan", forbidden)
    # The fraction's reference check simulates (test_reference_check.py); it is off here.
    monkeypatch.setattr(functorch_config, "activation_memory_budget_reference_estimator", None)
    full = partition_with_report(gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs)[2]
    partition_with_report(gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs, memory_budget=0.5)
    partition_with_report(gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs,
                          memory_budget_bytes=full.saved_bytes - 1)
    with functorch_config.patch(activation_memory_budget=0.3):
        min_cut_rematerialization_partition(gpt.fresh(), gpt.inputs,
                                            num_fwd_outputs=gpt.num_fwd_outputs)


def test_both_caps_hold(gpt):
    full_peak, full = _partition(gpt)
    least_peak = _least(gpt)
    bytes_cap = full.saved_bytes * 3 // 4
    peak_cap = (least_peak + full_peak) // 2
    peak, report = _partition(gpt, peak_cap, memory_budget_bytes=bytes_cap)
    assert peak <= peak_cap and report.activation_bytes <= bytes_cap
    assert report.memory_budget_bytes == bytes_cap and report.peak_bytes == peak_cap
    # Under a byte cap the peak cap chooses among the candidates within it: the least peak
    # reachable there is no lower than without the byte cap, and the error says so.
    least_within = _least(gpt, memory_budget_bytes=bytes_cap)
    assert least_within >= least_peak
    with pytest.raises(UnreachableMemoryBudgetError,
                       match="the least this graph can peak at within the activation memory "
                             f"budget is {least_within} bytes"):
        _partition(gpt, least_within - 1, memory_budget_bytes=bytes_cap)


def test_the_peak_is_absolute_inputs_and_parameters_included(gpt):
    full_peak, _ = _partition(gpt)
    fw, bw, _ = partition_with_report(gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs)
    timeline = simulate_partition(fw, bw)
    assert full_peak == timeline.peak_bytes > timeline.peak_above_baseline > 0
    inputs = sum(p.meta["val"].untyped_storage().nbytes()
                 for p in fw.graph.find_nodes(op="placeholder"))
    assert timeline.baseline_bytes == inputs  # what existed before the step is counted


class _MLP(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _recording_partition(records, static):
    """A partition_fn that runs ours with ``static`` as the static-lifetime inputs (aot_module
    passes none; dynamo passes the parameters) and records (report, fw, bw)."""

    def partition(joint, _inputs, *, num_fwd_outputs, **_kwargs):
        fw, bw, report = partition_with_report(joint, num_fwd_outputs=num_fwd_outputs,
                                               static_lifetime_input_indices=static)
        records.append((report, fw, bw))
        return fw, bw

    return partition


def _nop(gm, _example_inputs):
    return make_boxed_func(gm)


def test_parameters_are_resident_static_inputs_under_the_flag():
    torch.manual_seed(0)
    model, x = _MLP(), torch.randn(64, 32, requires_grad=True)
    static = list(range(len(list(model.parameters()))))  # aot_module puts them first
    records = []
    compiled = aot_module(model, fw_compiler=_nop, bw_compiler=_nop,
                          partition_fn=_recording_partition(records, static))
    with functorch_config.patch(activation_memory_peak_bytes=10**9):
        compiled(x).sum().backward()
    report, fw, bw = records[-1]
    timeline = simulate_partition(fw, bw, static_input_indices=static)
    assert report.simulated_peak_bytes == timeline.peak_bytes
    assert timeline.parameter_bytes == sum(p.numel() * 4 for p in model.parameters())
    # The labels change nothing: the peak counts every input, parameter or not.
    assert simulate_partition(fw, bw).peak_bytes == timeline.peak_bytes


def test_simulated_peak_measure_is_cached(gpt, count_simulations):
    module = gpt.fresh()
    measure = SimulatedPeak(module, gpt.num_fwd_outputs)
    report = partition_with_report(gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs)[2]
    saved = [n for n in module.graph.nodes if n.name in set(_saved_names(report))]
    count_simulations.clear()
    first = measure.of(saved)
    assert measure.of(list(reversed(saved))) == first and count_simulations == [1]
    assert measure.simulations == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "dropout"])
def test_flag_cap_matches_eager(name, capture, aot_with):
    case = make_case(name)
    joint = capture(case.module, *(t.clone().requires_grad_(t.is_floating_point())
                                  for t in case.inputs))
    full_peak, _ = _partition(joint)
    least = _least(joint)
    for cap in sorted({least, (least + full_peak) // 2}):
        with functorch_config.patch(activation_memory_peak_bytes=cap):
            assert_matches_eager(make_case(name), aot_with(min_cut_rematerialization_partition))
            assert _partition(joint)[0] <= cap


# ---- the Pareto sweep in bytes ----------------------------------------------------------------

def test_sweep_points_carry_the_partitions_simulated_peak(gpt, count_simulations):
    from aot_partition.report.pareto import memory_budget_pareto, score_partition

    budgets = [1.0, 0.5, 0.0]
    seen = []
    points = memory_budget_pareto(gpt.module, None, num_fwd_outputs=gpt.num_fwd_outputs,
                                  budgets=budgets, progress=lambda b: seen.extend(b) or b)
    assert seen == budgets
    for point in points:
        fw, bw, _ = partition_with_report(gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs,
                                          memory_budget=point.budget)
        scored = score_partition(fw, bw, point.budget)
        assert point.simulated_peak_bytes == scored.simulated_peak_bytes
        assert point.recompute_estimate == pytest.approx(scored.recompute_estimate)
    assert points[0].recompute_estimate <= points[-1].recompute_estimate
    count_simulations.clear()
    plain = memory_budget_pareto(gpt.module, None, num_fwd_outputs=gpt.num_fwd_outputs,
                                 budgets=budgets, simulate=False)
    assert count_simulations == [] and plain[0].simulated_peak_bytes is None


def test_plot_peak_front_writes_a_png(tmp_path):
    from aot_partition.report.pareto import PeakPoint, plot_peak_front

    ours = [PeakPoint(1.0, 3 * 2**20, 0.0, 2**20), PeakPoint(0.0, 2 * 2**20, 5.0, 2**19)]
    path = plot_peak_front({"ours": ours, "torch": ours[::-1]}, tmp_path / "out" / "p.png",
                           estimator="flops")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no simulated points"):
        plot_peak_front({"ours": []}, tmp_path / "q.png")


# ---- what a peak cap chooses from, and by what --------------------------------------------------

def _scores(joint, **config):
    """(simulated peak, roofline step estimate) of one partition under ``config``."""
    from aot_partition.config import PartitionConfig
    from aot_partition.costs.cut_runtime import step_estimate

    fw, bw, report = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                           config=PartitionConfig(**config))
    return (simulate_partition(fw.graph, bw.graph).peak_bytes,
            step_estimate(fw.graph, bw.graph, "roofline")), report


def test_peak_cap_orders_candidates_by_the_simulated_step(gpt, monkeypatch):
    """At the flops cut's peak at 0.8, the knapsack items' runtime preferred a cut whose whole
    step is 2.7% slower (it missed what the forward no longer runs); the step estimate of the
    simulation does not."""
    from aot_partition.budget import peak as peak_module

    (flops_peak, flops_step), _ = _scores(gpt, memory_budget=0.8, runtime_estimator="flops")
    (peak, step), _ = _scores(gpt, peak_bytes=flops_peak)
    assert peak <= flops_peak and step <= flops_step * (1 + 1e-9)
    # The opposite case: ordered by the knapsack items' runtime, the answer is slower.
    monkeypatch.setattr(peak_module.SimulatedPeak, "step_runtime", None)  # no step order
    (_, proxy_step), _ = _scores(gpt, peak_bytes=flops_peak)
    assert proxy_step > flops_step * 1.01


@pytest.mark.slow
def test_peak_cap_also_chooses_among_the_flops_cuts(capture):
    """gpt-12's flops cut at 0.5 peaks 4 KB below every roofline cut of the candidate grid:
    without the reference estimator's cuts a cap at its peak is unreachable."""
    from aot_pipeline.models import build_model

    built = build_model("gpt", layers=12)
    joint = capture(built.module, *built.make_inputs())
    (flops_peak, flops_step), _ = _scores(joint, memory_budget=0.5, runtime_estimator="flops")
    (peak, step), report = _scores(joint, peak_bytes=flops_peak)
    assert peak <= flops_peak and step <= flops_step * (1 + 1e-9)
    with pytest.raises(UnreachableMemoryBudgetError, match="simulated memory peak cap"):
        _scores(joint, peak_bytes=flops_peak, reference_estimator=None)
