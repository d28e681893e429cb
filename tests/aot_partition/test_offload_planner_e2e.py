"""The whole activation planner inside the partitioner (flag activation_offload_planner): through
aot_module with our partitioner and through torch.compile(backend="aot_pipeline") on zoo gpt and
llama, at a fraction and under a peak cap, outputs and every gradient equal eager's, the report
lists what was offloaded, the simulated peak respects the cap, the decision is deterministic, a
link too slow to hide any copy offloads nothing, and user tags win."""

from __future__ import annotations

import re

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import partitioners as partitioners_module
from aot_partition.budget import offload_plan
from aot_partition.config import PartitionConfig
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.fx.passes.offload_ops import offload_to_host
from aot_partition.memory_models.simulator import simulate_partition
from functorch.compile import aot_module, make_boxed_func
from torch.utils.checkpoint import CheckpointPolicy
from zoo import assert_matches_eager, make_case

FAST = 1e3    # GB/s: every copy of the zoo's tiny tensors hides
TINY = 1e-6   # GB/s: no copy hides


@pytest.fixture(autouse=True)
def small_planner(monkeypatch):
    """The zoo's tensors are under the 1 MiB floor; two peak fractions keep it fast."""
    monkeypatch.setattr(offload_plan, "OFFLOAD_MIN_BYTES", 0)
    monkeypatch.setattr(offload_plan, "PEAK_PLAN_FRACTIONS", (1.0, 0.0))


@pytest.fixture
def reports(monkeypatch):
    """Every partition's report, in call order."""
    seen = []
    monkeypatch.setattr(partitioners_module, "log_report", seen.append)
    return seen


def _nop(gm, _inputs):
    return make_boxed_func(gm)


def _aot(name, config, tag=None):
    """aot_module with our partitioner under ``config``; ``tag(joint)`` may tag the joint first.
    Returns [(fw, bw, static input indices)] and checks outputs and gradients against eager."""
    cuts = []

    def partition(joint, _inputs, *, num_fwd_outputs, static_lifetime_input_indices=None,
                  **_kwargs):
        if tag is not None:
            tag(joint)
        fw, bw, _ = partitioners_module.partition_with_report(
            joint, num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static_lifetime_input_indices, config=config)
        cuts.append((fw, bw, static_lifetime_input_indices))
        return fw, bw

    assert_matches_eager(make_case(name), lambda module: aot_module(
        module, fw_compiler=_nop, bw_compiler=_nop, partition_fn=partition))
    return cuts


def _compile(name, **flags):
    torch._dynamo.reset()
    # No cache hit from an earlier run: the planner must run (the key holds the flags, not it).
    with functorch_config.patch(activation_offload_planner=True, **flags), \
            torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        assert_matches_eager(make_case(name), lambda module: torch.compile(
            module, backend="aot_pipeline", options={"compiler": "nop"}))


def _decision(report):
    return report.solver, [d.name for d in report.saved], [d.name for d in report.offloaded]


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_fraction_plan_matches_eager_and_is_deterministic(name, reports):
    config = PartitionConfig(offload_planner=True, memory_budget=0.5,
                             offload_bandwidth_gbps=FAST)
    [(fw, _, _)] = _aot(name, config)
    _aot(name, config)
    first, again = reports
    assert first.solver.startswith("offload planner, plan 0.5")
    assert first.offloaded and all(d.reason.endswith("(planner)") for d in first.offloaded)
    assert sorted(n.args[0].name for n in fw.graph.nodes if n.target is offload_to_host) == \
        sorted(d.name for d in first.offloaded)
    assert _decision(first) == _decision(again)
    _compile(name, activation_memory_budget=0.5, activation_offload_cpu_gpu_bw=FAST)
    # (Dynamo's joint is not aot_module's: its own plan, with offloads too)
    assert reports[2].solver.startswith("offload planner, plan 0.5") and reports[2].offloaded


def _least_and_fastest_peaks(name):
    """(the least simulated peak any candidate reaches, the fastest candidate's peak)."""
    with pytest.raises(UnreachableMemoryBudgetError) as error:
        _aot(name, PartitionConfig(offload_planner=True, peak_bytes=1,
                                   offload_bandwidth_gbps=FAST))
    least = int(re.search(r"can peak at is (\d+) bytes", str(error.value)).group(1))
    [(fw, bw, static)] = _aot(name, PartitionConfig(offload_planner=True, peak_bytes=2**40,
                                                    offload_bandwidth_gbps=FAST))
    return least, simulate_partition(fw.graph, bw.graph, static_input_indices=static).peak_bytes


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_peak_cap_plan_matches_eager_and_respects_the_cap(name, reports):
    least, fastest = _least_and_fastest_peaks(name)
    assert least < fastest, "no trade-off to make: the test proves nothing"
    cap = (least + fastest) // 2
    [(fw, bw, static)] = _aot(name, PartitionConfig(offload_planner=True, peak_bytes=cap,
                                                    offload_bandwidth_gbps=FAST))
    report = reports[-1]
    assert report.simulated_peak_bytes <= cap
    assert simulate_partition(fw.graph, bw.graph, static_input_indices=static).peak_bytes \
        == report.simulated_peak_bytes  # the plan's peak is the returned graphs' peak
    _compile(name, activation_memory_peak_bytes=cap, activation_offload_cpu_gpu_bw=FAST)
    assert reports[-1].solver.startswith("offload planner")
    assert reports[-1].simulated_peak_bytes <= cap


def test_a_link_too_slow_offloads_nothing(reports):
    [(fw, _, _)] = _aot("gpt", PartitionConfig(offload_planner=True, memory_budget=0.5,
                                               offload_bandwidth_gbps=TINY))
    assert not reports[0].offloaded
    assert not [n for n in fw.graph.nodes if n.target is offload_to_host]
    _compile("gpt", activation_memory_budget=0.5, activation_offload_cpu_gpu_bw=TINY)
    assert not reports[1].offloaded


def test_user_tags_win(reports):
    config = PartitionConfig(offload_planner=True, memory_budget=0.5,
                             offload_bandwidth_gbps=FAST)
    _aot("gpt", config)
    planned = [d.name for d in reports[0].offloaded]
    kept = {d.name for d in reports[0].saved} - set(planned)
    tagged_offload = sorted(n for n in kept if n.startswith("_softmax"))  # kept by the plan
    assert planned and tagged_offload

    def tag(joint):
        for node in joint.graph.nodes:
            if node.name == planned[0]:
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            if node.name == tagged_offload[0]:
                node.meta["should_offload"] = True

    _aot("gpt", config, tag)
    offloaded = {d.name: d.reason for d in reports[1].offloaded}
    assert planned[0] not in offloaded  # MUST_SAVE is never offloaded
    assert planned[0] in {d.name for d in reports[1].saved}
    assert offloaded[tagged_offload[0]].endswith("(should_offload tag)")


def test_byte_cap_plan_and_best_effort(reports):
    with pytest.raises(UnreachableMemoryBudgetError, match=r"activation memory budget 1 bytes "
                                                           r"is unreachable: the least"):
        _aot("gpt", PartitionConfig(offload_planner=True, memory_budget_bytes=1,
                                    offload_bandwidth_gbps=FAST))
    with pytest.warns(partitioners_module.MemoryBudgetBestEffortWarning,
                      match=r"best effort .*: took least-bytes plan at \d+ bytes"):
        _aot("gpt", PartitionConfig(offload_planner=True, memory_budget_bytes=1,
                                    best_effort=True, offload_bandwidth_gbps=FAST))
    least = reports[-1].activation_bytes
    assert reports[-1].solver.startswith("offload planner, plan within") and least > 1
    _aot("gpt", PartitionConfig(offload_planner=True, memory_budget_bytes=2 * least,
                                offload_bandwidth_gbps=FAST))
    assert least <= reports[-1].activation_bytes <= 2 * least
