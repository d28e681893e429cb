"""Activation offloading (fx/offload.py): flags, the graph rewrite's structure, user tags,
the planner hook, numerics against eager, and the memory simulator's accounting."""

from __future__ import annotations

import logging

import pytest
import torch
import torch._functorch.config as torch_config
from aot_config import functorch as functorch_config
from aot_partition import default_partition, min_cut_rematerialization_partition
from aot_partition import partitioners as partitioners_module
from aot_partition.config import PartitionConfig
from aot_partition.fx.offload import OffloadedValue, host_link_bandwidth
from aot_partition.fx.passes.offload_ops import (
    offload_to_host,
    prefetch_to_device,
    wait_offload,
    wait_prefetch,
)
from aot_partition.memory_models.simulator import simulate_partition
from aot_partition.partitioners import partition_with_report
from functorch.compile import aot_function, make_boxed_func
from torch.utils.checkpoint import CheckpointPolicy

TAGGED = PartitionConfig(offload_tagged=True)


def _nop(gm, _inputs):
    return make_boxed_func(gm)


def two_layers(x, w1, w2):
    h = torch.relu(x @ w1)
    g = torch.tanh(h @ w2)
    return (g @ w2.t()).sum()


def _run(fn, inputs, partition, tags=(), must_save=(), config=TAGGED):
    """(grads through aot_function with ``partition`` and the tagged joint, eager grads,
    records of (fw, bw, report or None))."""
    records = []

    def partition_fn(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        for node in joint.graph.nodes:
            if node.name in tags:
                node.meta["should_offload"] = True
            if node.name in must_save:
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        if partition is partition_with_report:
            fw, bw, report = partition_with_report(joint, num_fwd_outputs=num_fwd_outputs,
                                                   config=config)
        else:
            fw, bw = partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                               config=config, **kwargs)
            report = None
        records.append((fw, bw, report))
        return fw, bw

    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    compiled = aot_function(fn, _nop, _nop, partition_fn=partition_fn)
    out = compiled(*leaves)
    out.backward()
    ref_leaves = [t.detach().clone().requires_grad_() for t in inputs]
    ref = fn(*ref_leaves)
    ref.backward()
    torch.testing.assert_close(out, ref)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad)
    return records


def _inputs(n=64):
    torch.manual_seed(0)
    return [torch.randn(n, n) for _ in range(3)]


def _calls(graph, op):
    return [n for n in graph.nodes if n.op == "call_function" and n.target is op]


# ---- flags -------------------------------------------------------------------------------------

def test_flags_reach_the_config():
    assert not PartitionConfig.from_flags().offloading
    with functorch_config.patch(enable_activation_offloading=True, activation_offload_planner=True,
                                activation_offload_cpu_gpu_bw=25.0):
        config = PartitionConfig.from_flags()
    assert (config.offload_tagged, config.offload_planner, config.offload_bandwidth_gbps,
            config.offload_device) == (True, True, 25.0, "cpu")
    assert config.offloading


def test_torch_enable_activation_offloading_is_honoured():
    if not hasattr(torch_config, "enable_activation_offloading"):
        pytest.skip("this torch has no enable_activation_offloading")
    with torch_config.patch(enable_activation_offloading=True):
        assert PartitionConfig.from_flags().offload_tagged


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_bandwidth_flag_must_be_positive(bad):
    with pytest.raises(ValueError, match="activation_offload_cpu_gpu_bw"):
        functorch_config.activation_offload_cpu_gpu_bw = bad
    with pytest.raises(ValueError, match="activation_offload_cpu_gpu_bw must be a positive"):
        host_link_bandwidth(torch.device("cpu"), bad)


def test_device_flag_takes_only_cpu():
    with pytest.raises(ValueError, match="activation_offload_device"):
        functorch_config.activation_offload_device = "disk"


def test_host_link_from_the_device_table():
    from aot_partition.costs import roofline

    assert host_link_bandwidth(torch.device("cpu"), None) == roofline.CONSERVATIVE_CPU.bandwidth
    assert host_link_bandwidth(torch.device("cpu"), 10.0) == 10e9
    roofline.set_device_numbers("cuda", "H100 PCIe")
    try:
        assert host_link_bandwidth(torch.device("cuda"), None) == 50e9
    finally:
        roofline.set_device_numbers("cuda", None)


# ---- the rewrite ---------------------------------------------------------------------------------

@pytest.mark.parametrize("partition", [min_cut_rematerialization_partition, default_partition])
def test_tagged_values_are_offloaded_with_copy_wait_prefetch_wait(partition):
    [(fw, bw, _)] = _run(two_layers, _inputs(), partition, tags=("relu", "tanh"))
    fw_nodes, bw_nodes = list(fw.graph.nodes), list(bw.graph.nodes)
    fw_at = {n: i for i, n in enumerate(fw_nodes)}
    bw_at = {n: i for i, n in enumerate(bw_nodes)}
    outputs = fw_nodes[-1].args[0]
    for name in ("relu", "tanh"):
        value = next(n for n in fw_nodes if n.name == name)
        [copy] = [n for n in _calls(fw.graph, offload_to_host) if n.args[0] is value]
        [done] = [n for n in _calls(fw.graph, wait_offload) if n.args[0] is copy]
        assert fw_at[copy] == fw_at[value] + 1  # the copy starts as soon as the value exists
        assert done.args[1] is value            # the wait is the device value's last use ...
        assert all(fw_at[u] <= fw_at[done] for u in value.users)  # ... and frees it
        assert value not in outputs and done in outputs  # the host copy is saved instead
        assert copy.meta["val"].device.type == "cpu"
        host = next(n for n in bw_nodes if n.op == "placeholder" and n.name == name)
        [fetch] = [n for n in _calls(bw.graph, prefetch_to_device) if n.args[0] is host]
        [ready] = [n for n in _calls(bw.graph, wait_prefetch) if n.args[0] is fetch]
        assert set(host.users) == {fetch, ready}  # nothing else reads the host copy
        first_use = min(ready.users, key=bw_at.__getitem__)
        assert bw_at[fetch] < bw_at[ready] == bw_at[first_use] - 1  # wait right before use
    relu_fetch = next(n for n in _calls(bw.graph, prefetch_to_device) if n.name.startswith("relu"))
    relu_ready = next(iter(relu_fetch.users))
    between = bw_nodes[bw_at[relu_fetch] + 1:bw_at[relu_ready]]
    assert any(n.target is torch.ops.aten.tanh_backward.default for n in between)  # early


@pytest.mark.parametrize(("device", "pinned"), [("cpu", True), ("cpu_pageable", False)])
def test_the_device_flag_chooses_pinned_or_pageable_host_memory(device, pinned):
    config = PartitionConfig(offload_tagged=True, offload_device=device)
    [(fw, _, _)] = _run(two_layers, _inputs(), min_cut_rematerialization_partition,
                        tags=("tanh",), config=config)
    [copy] = _calls(fw.graph, offload_to_host)
    assert copy.args[1] is pinned


def test_without_the_flag_tags_change_nothing():
    [(fw, bw, _)] = _run(two_layers, _inputs(), min_cut_rematerialization_partition,
                         tags=("relu", "tanh"), config=PartitionConfig())
    assert not _calls(fw.graph, offload_to_host) and not _calls(bw.graph, prefetch_to_device)


def test_must_save_is_never_offloaded_and_the_report_says_why():
    [(fw, _, report)] = _run(two_layers, _inputs(), partition_with_report,
                             tags=("relu", "tanh"), must_save=("relu",))
    assert [n.args[0].name for n in _calls(fw.graph, offload_to_host)] == ["tanh"]
    assert any("'relu' is tagged should_offload but stays: tagged MUST_SAVE" in note
               for note in report.notes)
    [row] = report.offloaded
    assert (row.name, row.decision) == ("tanh", "offloaded")
    assert row.reason.startswith(f"offloaded: {64 * 64 * 4} bytes over forward '")
    assert row.reason.endswith("(should_offload tag)")
    assert "offloaded:" in report.format()


def test_a_recomputed_tagged_value_stays_with_a_note():
    # ``mm`` (relu's input) is recomputed or never read by the backward: nothing to offload.
    [(fw, _, report)] = _run(two_layers, _inputs(), partition_with_report, tags=("mm",))
    assert not _calls(fw.graph, offload_to_host)
    assert any("'mm' is tagged should_offload but stays: not a saved tensor" in note
               for note in report.notes)


def test_a_view_is_not_offloaded_its_base_would_stay():
    # ``t`` (w2.t(), saved for the last matmul's backward) is a view of an input.
    [(fw, _, report)] = _run(two_layers, _inputs(), partition_with_report, tags=("t", "tanh"))
    assert [n.args[0].name for n in _calls(fw.graph, offload_to_host)] == ["tanh"]
    assert any("'t' is tagged should_offload but stays: a view or alias" in note
               for note in report.notes)


def transposed_copy(x):
    return x.t().clone().sin().sum()  # clone keeps the transposed strides; sin saves it


def test_a_strided_dense_value_is_offloaded_with_its_strides():
    [(fw, bw, _)] = _run(transposed_copy, [torch.randn(8, 16)], default_partition,
                         tags=("clone",))
    [copy] = _calls(fw.graph, offload_to_host)
    assert copy.args[0].meta["val"].stride() == (1, 16) == copy.meta["val"].stride()
    [fetch] = _calls(bw.graph, prefetch_to_device)
    assert fetch.meta["val"].stride() == (1, 16)


def test_an_overlapping_value_is_not_offloadable():
    from aot_partition.fx.offload import offload_obstacle

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    node.meta["val"] = torch.empty_strided((4, 4), (0, 1))  # rows share memory
    assert offload_obstacle(node, {node}, []).startswith("not dense")
    node.meta["val"] = torch.empty_strided((4, 4), (1, 4))  # column-major: dense
    assert offload_obstacle(node, {node}, []) is None


# ---- the planner hook ------------------------------------------------------------------------------

def _with_planner(monkeypatch, plan):
    calls = []

    def recording(joint_graph, saved_values, config):
        calls.append(([n.name for n in saved_values], config))
        return plan(joint_graph, saved_values, config)

    monkeypatch.setattr(partitioners_module, "_offload_planner", lambda: recording)
    # the hook over a cut's fixed saved set (the whole planner: test_offload_planner_e2e.py)
    monkeypatch.setattr(partitioners_module, "_whole_planner", lambda config, regions: None)
    return calls


def test_the_planner_decides_what_is_offloaded(monkeypatch):
    calls = _with_planner(monkeypatch, lambda g, saved, c: ["tanh"])
    config = PartitionConfig(offload_planner=True)
    [(fw, _, report)] = _run(two_layers, _inputs(), partition_with_report, config=config)
    [(saved, seen_config)] = calls
    assert "tanh" in saved and seen_config is config
    assert [n.args[0].name for n in _calls(fw.graph, offload_to_host)] == ["tanh"]
    assert report.offloaded[0].reason.endswith("(planner)")


def test_the_planner_off_is_never_asked(monkeypatch):
    calls = _with_planner(monkeypatch, lambda g, saved, c: ["tanh"])
    _run(two_layers, _inputs(), min_cut_rematerialization_partition, config=TAGGED)
    assert calls == []


@pytest.mark.parametrize(("name", "why"), [
    ("mm", "not a saved tensor of this cut"),
    ("relu", "tagged MUST_SAVE"),
    ("nonexistent", "not a node of the forward graph"),
])
def test_a_planner_asking_the_impossible_is_an_error(monkeypatch, name, why):
    _with_planner(monkeypatch, lambda g, saved, c: [name])
    with pytest.raises(ValueError, match=rf"cannot offload '{name}' \(planner\): {why}.*"
                                         r"offloadable saved values of this cut: \["):
        _run(two_layers, _inputs(), min_cut_rematerialization_partition, must_save=("relu",),
             config=PartitionConfig(offload_planner=True))


def test_planner_flag_without_a_planner_module_warns(monkeypatch, caplog):
    monkeypatch.setattr(partitioners_module, "_planner_module", lambda: None)
    with caplog.at_level(logging.WARNING, logger="aot_partition.partitioners"):
        [(fw, _, report)] = _run(two_layers, _inputs(), partition_with_report, tags=("tanh",),
                                 config=PartitionConfig(offload_planner=True))
    assert "offload_plan is not installed" in caplog.text
    assert any("offload_plan is not installed" in note for note in report.notes)
    assert [n.args[0].name for n in _calls(fw.graph, offload_to_host)] == ["tanh"]  # tags


# ---- the memory simulator ------------------------------------------------------------------------

def chain(x):
    return x.exp().exp().sin().sin().sum()


def test_simulated_peak_drops_by_the_offloaded_bytes():
    # 1024 float32 = 4096 B a value. Without offloading the peak is at mul_1 (sin's backward):
    # x, exp, exp_1, mul, cos_1, mul_1 and the 4-byte tangent = 24580 B. Offloading ``exp``
    # (first read by the last mul) takes it off the device there: 20484 B.
    x = [torch.randn(1024)]
    [(fw0, bw0, _)] = _run(chain, x, default_partition, config=PartitionConfig())
    [(fw1, bw1, _)] = _run(chain, x, default_partition, tags=("exp",))
    before, after = simulate_partition(fw0, bw0), simulate_partition(fw1, bw1)
    assert (before.peak_bytes, after.peak_bytes) == (24580, 20484)
    assert before.transfers == [] and after.offloaded_bytes == 4096
    out, back = after.transfers
    assert (out.direction, back.direction, out.nbytes, back.nbytes) == (
        "to_host", "to_device", 4096, 4096)
    assert out.seconds == pytest.approx(4096 / host_link_bandwidth(torch.device("cpu"), None))
    assert after.exposed_transfer_seconds == out.exposed_seconds + back.exposed_seconds
    # freed over its window: live bytes after the copy-out's wait are one value lower
    at = {s.node: s for s in after.steps}
    assert at["exp_host_ready"].live_bytes == at["exp_host_ready"].high_bytes - 4096


def test_offloaded_value_reports_exposed_time():
    value = OffloadedValue("a", 100, "planner", "f", "b", "u", 2.0, 0.5, 3.0)
    assert value.exposed_seconds == 1.5
    assert value.describe() == "offloaded: 100 bytes over forward 'f' .. backward 'b' (planner)"
