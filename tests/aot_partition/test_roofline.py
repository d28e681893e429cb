"""The "roofline" runtime estimator: bandwidth-bound pointwise ops, compute-bound matmuls, free
views, the device table and its overrides, and the budget search running on it."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.fx as fx
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition
from aot_partition.budget.search import BudgetSearch
from aot_partition.costs import estimators, roofline
from aot_partition.costs.estimators import RUNTIME_ESTIMATORS, count_flops, estimate_runtime
from aot_partition.costs.roofline import (
    CONSERVATIVE_CPU,
    CONSERVATIVE_CUDA,
    DEVICE_TABLE,
    DeviceNumbers,
    bytes_moved,
    device_numbers,
    lookup,
    set_device_numbers,
)
from aot_partition.fx.classify import classify
from torch._subclasses.fake_tensor import FakeTensorMode
from zoo import assert_matches_eager, make_case


@pytest.fixture(autouse=True)
def fresh_estimates():
    estimators.clear_runtime_cache()
    yield
    for device in ("cpu", "cuda", "xpu"):
        set_device_numbers(device, None)
    estimators.clear_runtime_cache()


def calls(joint, packet):
    return [n for n in joint.module.graph.nodes
            if n.op == "call_function" and getattr(n.target, "overloadpacket", None) is packet]


def pointwise_chain(x, w):
    return ((x @ w).relu() * 2 + 1).sin().view(-1).sum()


def chain_joint(capture, rows: int):
    torch.manual_seed(0)
    return capture(pointwise_chain, torch.randn(rows, 64, requires_grad=True),
                   torch.randn(64, 128, requires_grad=True))


def test_roofline_is_registered():
    assert "roofline" in RUNTIME_ESTIMATORS


def test_pointwise_chain_is_bandwidth_bound_and_proportional_to_bytes(capture):
    small, big = chain_joint(capture, 256), chain_joint(capture, 512)
    for packet in (torch.ops.aten.relu, torch.ops.aten.mul, torch.ops.aten.add,
                   torch.ops.aten.sin):
        node_small, node_big = calls(small, packet)[0], calls(big, packet)[0]
        seconds = estimate_runtime(node_small, "roofline")
        assert seconds > 0
        # read one fp32 256x128 tensor, write one: all memory, no compute term
        assert bytes_moved(node_small) == 2 * 256 * 128 * 4
        assert seconds == pytest.approx(bytes_moved(node_small) / CONSERVATIVE_CPU.bandwidth)
        assert estimate_runtime(node_big, "roofline") == pytest.approx(2 * seconds)
        assert estimate_runtime(node_small, "flops") == 1.0  # what the flops estimator says


def test_big_matmul_is_compute_bound(capture):
    torch.manual_seed(0)
    joint = capture(lambda a, b: (a @ b).sum(), torch.randn(512, 1024, requires_grad=True),
                    torch.randn(1024, 512, requires_grad=True))
    mm = calls(joint, torch.ops.aten.mm)[0]
    flops = count_flops(mm)
    assert flops == 2 * 512 * 1024 * 512
    compute_s = flops / CONSERVATIVE_CPU.fp32
    assert compute_s > bytes_moved(mm) / CONSERVATIVE_CPU.bandwidth
    assert estimate_runtime(mm, "roofline") == pytest.approx(compute_s)


def test_views_and_metadata_cost_nothing(capture):
    joint = chain_joint(capture, 256)
    for packet in (torch.ops.aten.view, torch.ops.aten.t, torch.ops.aten.expand,
                   torch.ops.aten.detach):
        for node in calls(joint, packet):
            assert bytes_moved(node) == 0
            assert estimate_runtime(node, "roofline") == 0.0


def test_expanded_inputs_are_read_once():
    with FakeTensorMode():
        scalar = torch.empty(()).expand(1024, 1024)
    assert roofline.touched_bytes(scalar) == 4


def test_table_lookup_by_cuda_device_name():
    assert lookup("NVIDIA H100 80GB HBM3") is DEVICE_TABLE["H100 80GB HBM3"]
    assert lookup("NVIDIA H100 PCIe") is DEVICE_TABLE["H100 PCIe"]
    assert lookup("NVIDIA H200") is DEVICE_TABLE["H200"]
    assert lookup("NVIDIA A100-SXM4-80GB").bandwidth > lookup("NVIDIA A100-SXM4-40GB").bandwidth
    assert lookup("NVIDIA A10G") is DEVICE_TABLE["A10G"]  # not A10, not A100
    assert lookup("NVIDIA L4") is DEVICE_TABLE["L4"]
    assert lookup("NVIDIA L40S") is DEVICE_TABLE["L40S"]
    assert lookup("NVIDIA GeForce RTX 4090") is DEVICE_TABLE["RTX 4090"]
    assert lookup("Tesla V100-SXM2-16GB") is DEVICE_TABLE["V100-SXM2"]
    assert lookup("Imaginary Accelerator 9000") is None


def test_peak_flops_depend_on_dtype_and_tensor_cores():
    h100 = DEVICE_TABLE["H100 SXM"]
    assert h100.peak_flops(torch.bfloat16, True) > h100.peak_flops(torch.bfloat16, False)
    assert h100.peak_flops(torch.float16, True) == h100.half_matmul
    assert h100.peak_flops(torch.float64, True) == h100.fp64
    with_tf32 = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert h100.peak_flops(torch.float32, True) == h100.tf32
        torch.set_float32_matmul_precision("highest")
        assert h100.peak_flops(torch.float32, True) == h100.fp32
    finally:
        torch.set_float32_matmul_precision(with_tf32)
    assert h100.peak_flops(torch.float32, False) == h100.fp32
    v100 = DEVICE_TABLE["V100-SXM2"]  # no bf16 tensor cores
    assert v100.peak_flops(torch.bfloat16, True) < v100.peak_flops(torch.float16, True)


def fake_cuda_node(op, *shapes, dtype=torch.bfloat16) -> fx.Node:
    """A one-op graph whose values are fake CUDA tensors (no GPU needed)."""
    graph = fx.Graph()
    with FakeTensorMode():
        vals = [torch.empty(s, device="cuda", dtype=dtype) for s in shapes]
        out = op(*vals)
    args = []
    for i, val in enumerate(vals):
        placeholder = graph.placeholder(f"x{i}")
        placeholder.meta["val"] = val
        args.append(placeholder)
    node = graph.call_function(op, tuple(args))
    node.meta["val"] = out
    return node


def test_cuda_nodes_use_the_named_device(monkeypatch):
    monkeypatch.setattr(roofline, "_cuda_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    roofline._cuda_numbers.cache_clear()
    try:
        mm = fake_cuda_node(torch.ops.aten.mm.default, (4096, 4096), (4096, 4096))
        h100 = DEVICE_TABLE["H100 80GB HBM3"]
        assert estimate_runtime(mm, "roofline") == pytest.approx(
            2 * 4096**3 / h100.half_matmul)
        add = fake_cuda_node(torch.ops.aten.add.Tensor, (4096, 4096), (4096, 4096))
        assert estimate_runtime(add, "roofline") == pytest.approx(
            3 * 4096 * 4096 * 2 / h100.bandwidth)
    finally:
        roofline._cuda_numbers.cache_clear()


def test_unknown_cuda_device_falls_back_with_a_log_message(monkeypatch, caplog):
    monkeypatch.setattr(roofline, "_cuda_device_name", lambda index: "Imaginary GPU 9000")
    roofline._cuda_numbers.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="aot_partition.costs.roofline"):
            assert device_numbers(torch.device("cuda", 0)) is CONSERVATIVE_CUDA
        assert "Imaginary GPU 9000" in caplog.text and "set_device_numbers" in caplog.text
    finally:
        roofline._cuda_numbers.cache_clear()


def test_unknown_device_type_falls_back_with_a_log_message(caplog):
    roofline._log_fallback_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="aot_partition.costs.roofline"):
        assert device_numbers(torch.device("xpu")) is CONSERVATIVE_CPU
    assert "'xpu'" in caplog.text


def test_overrides_change_estimates_and_invalidate_the_cache(capture, monkeypatch):
    relu = calls(chain_joint(capture, 256), torch.ops.aten.relu)[0]
    before = estimate_runtime(relu, "roofline")
    fast = DeviceNumbers("fast cpu", bandwidth=4 * CONSERVATIVE_CPU.bandwidth, fp32=1e12,
                         tf32=1e12, half_matmul=1e12, half_vector=1e12, fp64=1e12)
    set_device_numbers("cpu", fast)
    assert estimate_runtime(relu, "roofline") == pytest.approx(before / 4)
    set_device_numbers("cpu", None)
    assert estimate_runtime(relu, "roofline") == pytest.approx(before)
    with pytest.raises(ValueError, match="unknown roofline device 'Imaginary'"):
        set_device_numbers("cuda", "Imaginary")
    # a table entry by name, for every CUDA device (e.g. estimating for an H100 from a laptop)
    set_device_numbers("cuda", "H100 SXM")
    assert device_numbers(torch.device("cuda", 0)) is DEVICE_TABLE["H100 SXM"]
    monkeypatch.setenv(roofline.ENV_CUDA_DEVICE, "A10G")
    set_device_numbers("cuda", None)
    assert device_numbers(torch.device("cuda", 0)) is DEVICE_TABLE["A10G"]


def test_budget_search_sees_pointwise_candidates_as_not_free(capture):
    case = make_case("gpt")
    joint = capture(case.module, *case.inputs)
    module = joint.fresh()
    info = classify(module, joint.num_fwd_outputs)
    search = BudgetSearch.prepare(module.graph, info, solver="dp", estimator="roofline")
    search.saved_values(0.5)
    assert search.candidates
    assert all(r > 0 for r in search.item_runtimes())


@pytest.mark.parametrize("name", ["mlp", "gpt", "llama"])
@pytest.mark.parametrize("solver", ["dp", "ilp_graph"])
def test_roofline_budget_matches_eager(name, solver, aot_with):
    with functorch_config.patch(activation_memory_budget=0.5,
                                activation_memory_budget_solver=solver,
                                activation_memory_budget_runtime_estimator="roofline"):
        assert_matches_eager(make_case(name), aot_with(min_cut_rematerialization_partition))


def test_default_estimator_is_roofline_and_only_matters_below_budget_one(capture):
    from aot_partition.config import PartitionConfig
    from aot_partition.partitioners import partition_with_report

    assert functorch_config.activation_memory_budget_runtime_estimator == "roofline"
    assert PartitionConfig().runtime_estimator == "roofline"
    case = make_case("gpt")
    joint = capture(case.module, *case.inputs)

    def partition(budget, estimator):
        with functorch_config.patch(activation_memory_budget_runtime_estimator=estimator):
            fw, bw, report = partition_with_report(
                joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs, memory_budget=budget)
        seconds = sum(estimate_runtime(n, "roofline") for g in (fw.graph, bw.graph)
                      for n in g.nodes if n.op == "call_function")
        return [d.name for d in report.saved], seconds

    # At 1.0 there is no knapsack: the estimator must not change the cut.
    assert partition(1.0, "roofline") == partition(1.0, "flops")
    # At 0.5 it must: "flops" calls pointwise recompute free; "roofline" pays its traffic, so
    # its step is cheaper by the roofline estimate.
    (saved_roofline, roofline_s), (saved_flops, flops_s) = (partition(0.5, "roofline"),
                                                            partition(0.5, "flops"))
    assert saved_roofline != saved_flops
    assert roofline_s < flops_s
