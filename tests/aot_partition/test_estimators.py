"""Runtime estimators on real joint-graph nodes: FLOPs match the FLOP counter, errors list names."""

from __future__ import annotations

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition.costs import estimators
from aot_partition.costs.estimators import estimate_runtime
from functorch.compile import aot_function, make_boxed_func
from torch._functorch.partitioners import default_partition
from torch.utils.flop_counter import FlopCounterMode


def joint_graph_of(fn, *inputs) -> torch.fx.GraphModule:
    captured = {}

    def capture(joint, joint_inputs, **kwargs):
        captured["joint"] = joint
        return default_partition(joint, joint_inputs, **kwargs)

    compiled = aot_function(fn, fw_compiler=lambda g, _: make_boxed_func(g),
                            bw_compiler=lambda g, _: make_boxed_func(g),
                            partition_fn=capture)
    compiled(*inputs)
    return captured["joint"]


def mlp(x, w1, w2):
    return torch.relu(x @ w1).mm(w2).sum()


@pytest.fixture
def mlp_joint():
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True),
              torch.randn(32, 4, requires_grad=True))
    return joint_graph_of(mlp, *inputs)


def node_by_target(graph_module, packet):
    return [n for n in graph_module.graph.nodes
            if n.op == "call_function" and getattr(n.target, "overloadpacket", None) is packet]


def test_flops_of_matmuls_match_the_flop_counter(mlp_joint):
    estimators.clear_runtime_cache()
    mms = node_by_target(mlp_joint, torch.ops.aten.mm)
    assert len(mms) >= 2
    for node in mms:
        a, b = (arg.meta["val"] for arg in node.args)
        with FlopCounterMode(display=False) as mode:
            torch.mm(torch.zeros(a.shape), torch.zeros(b.shape))
        assert estimate_runtime(node, "flops") == mode.get_total_flops()
        assert mode.get_total_flops() == 2 * a.shape[0] * a.shape[1] * b.shape[1]


def test_ops_without_flop_formula_count_one(mlp_joint):
    relu = node_by_target(mlp_joint, torch.ops.aten.relu)[0]
    assert estimate_runtime(relu, "flops") == 1.0
    placeholder = next(iter(mlp_joint.graph.nodes))
    assert estimate_runtime(placeholder, "flops") == 1.0


def test_testing_estimator_is_one_and_default_follows_the_flag(mlp_joint):
    mm = node_by_target(mlp_joint, torch.ops.aten.mm)[0]
    with functorch_config.patch(activation_memory_budget_runtime_estimator="testing"):
        assert estimate_runtime(mm) == 1.0
    with functorch_config.patch(activation_memory_budget_runtime_estimator="flops"):
        assert estimate_runtime(mm) > 1.0


def test_profile_times_on_cpu(mlp_joint):
    mm = node_by_target(mlp_joint, torch.ops.aten.mm)[0]
    ms = estimate_runtime(mm, "profile")
    assert 0.0 < ms < 1000.0


def test_estimates_are_cached_by_signature(mlp_joint):
    estimators.clear_runtime_cache()
    mms = node_by_target(mlp_joint, torch.ops.aten.mm)
    estimate_runtime(mms[0], "flops")
    size = len(estimators._cache)
    estimate_runtime(mms[0], "flops")
    assert len(estimators._cache) == size == 1


def test_unknown_estimator_lists_valid_ones(mlp_joint):
    mm = node_by_target(mlp_joint, torch.ops.aten.mm)[0]
    with pytest.raises(ValueError, match="Unknown runtime estimator 'guess'; valid: flops, "
                                         "roofline, profile, testing"):
        estimate_runtime(mm, "guess")


def test_profile_keeps_the_random_stream():
    # The partitioner runs before the forward: profiling a random op must not shift the draws.
    joint = joint_graph_of(lambda x: torch.nn.functional.dropout(x, 0.5).sum(),
                           torch.randn(64, 64, requires_grad=True))
    dropout = node_by_target(joint, torch.ops.aten.native_dropout)
    assert dropout
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    assert estimate_runtime(dropout[0], "profile") > 0
    torch.testing.assert_close(torch.rand(4), expected)


def test_profile_falls_back_to_roofline_when_the_op_fails(mlp_joint, monkeypatch):
    estimators.clear_runtime_cache()
    relu = node_by_target(mlp_joint, torch.ops.aten.relu)[0]

    def broken(node, on_cuda):
        raise RuntimeError("no kernel for zero-filled arguments")

    monkeypatch.setattr(estimators, "_run_and_time", broken)
    ms = estimate_runtime(relu, "profile")
    assert ms > 0 and ms == pytest.approx(estimate_runtime(relu, "roofline") * 1e3)
    estimators.clear_runtime_cache()


@pytest.mark.cuda
def test_profile_times_on_cuda():
    inputs = (torch.randn(64, 64, device="cuda", requires_grad=True),
              torch.randn(64, 64, device="cuda", requires_grad=True),
              torch.randn(64, 8, device="cuda", requires_grad=True))
    joint = joint_graph_of(mlp, *inputs)
    mm = node_by_target(joint, torch.ops.aten.mm)[0]
    assert mm.meta["val"].is_cuda
    ms = estimate_runtime(mm, "profile")
    assert 0.0 < ms < 100.0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_profile_under_fake_mode_times_real_tensors(device, monkeypatch):
    # Inside torch.compile the partitioner runs under AOTAutograd's FakeTensorMode. Arguments
    # made there were fake, and running the kernel on them read a null pointer: a segfault on
    # CPU, an illegal memory access on CUDA. The op must see plain tensors and really run.
    from torch._subclasses.fake_tensor import FakeTensorMode

    inputs = tuple(torch.randn(*shape, device=device, requires_grad=True)
                   for shape in ((64, 64), (64, 64), (64, 8)))
    joint = joint_graph_of(mlp, *inputs)
    mm = node_by_target(joint, torch.ops.aten.mm)[0]
    seen: list[type] = []
    real_mm = torch.ops.aten.mm.default

    def spy(*args, **kwargs):
        seen.extend(type(a) for a in args)
        if all(type(a) is torch.Tensor for a in args):  # a fake one would crash the process
            return real_mm(*args, **kwargs)
        return None

    monkeypatch.setattr(mm, "target", spy)
    estimators.clear_runtime_cache()
    with FakeTensorMode():
        ms = estimate_runtime(mm, "profile")
    estimators.clear_runtime_cache()
    assert seen and set(seen) == {torch.Tensor}
    assert ms > 0


def test_real_tensor_check_names_the_fake_one():
    from aot_partition.fx._compat import check_real_tensors
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(2)
    check_real_tensors(([torch.empty(2)], {"x": 1}), "profiling mm")
    with pytest.raises(TypeError, match="^profiling mm: got a FakeTensor where a real tensor "
                                        "is needed$"):
        check_real_tensors(([torch.empty(2), fake], {}), "profiling mm")
