"""Our RNG-replay operators under what users wrap around training: dispatch modes (an op
counter, FlopCounterMode, both), anomaly detection, autocast and no_grad.

At budget 0.0 the dropout is recomputed: the forward runs it through our
``run_and_save_rng_state`` and the backward replays it through ``run_with_rng_state``.
torch's operators of the same names raise NotImplementedError under a mode with no rule
for them; ours let the mode see the ops inside, as eager does.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
from aot_partition.config import PartitionConfig
from aot_partition.fx.passes.rng_ops import run_and_save_rng_state, run_with_rng_state
from aot_partition.partitioners import partition_with_report
from functorch.compile import aot_module, make_boxed_func
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from zoo import DropoutNet, loss_of

BATCH, DIM = 512, 16  # a mask (8 KiB) bigger than a CPU RNG state (5,056 bytes): replayed
RECOMPUTED_FLOPS = 2 * BATCH * DIM * DIM  # the recomputed first linear layer


class OpCounter(TorchDispatchMode):
    """A user's dispatch mode with no rule for any higher-order operator."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


class HopRecorder(OpCounter):
    """A mode that takes higher-order operators itself: it sees ours whole."""

    supports_higher_order_operators = True


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return DropoutNet(DIM)


def _input() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(BATCH, DIM)


def _nop(gm, _inputs):
    # Call the code, not the module: FlopCounterMode's module tracker hooks every module
    # call, and on a graph module called inside autograd.Function.forward its hook fails
    # ("Expected gradient function to be set"; the same with torch's partitioners).
    return make_boxed_func(gm.forward)


def _aot(module: torch.nn.Module, budget: float, reports: list | None = None):
    config = PartitionConfig.from_flags().replace(memory_budget=budget)

    def partition(joint, _inputs, *, num_fwd_outputs, **kwargs):
        fw, bw, report = partition_with_report(
            joint, num_fwd_outputs=num_fwd_outputs, config=config,
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))
        if reports is not None:
            reports.append((fw, bw, report))
        return fw, bw

    return aot_module(module, fw_compiler=_nop, bw_compiler=_nop, partition_fn=partition)


def _step(call, module, x, context=contextlib.nullcontext):
    """Forward and backward from seed 0 under ``context``: (output, grads by name)."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with context():
        out = call(x)
        if torch.is_grad_enabled():
            loss_of(out).backward()
    return out.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}


def _assert_same_step(got, want, **tolerance):
    torch.testing.assert_close(got[0], want[0], **tolerance)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], **tolerance)


def _compiled(budget: float, reports: list | None = None):
    module = _model()
    call = _aot(module, budget, reports)
    _step(call, module, _input())  # compile outside any mode
    return call, module


def test_replay_operators_are_in_the_graphs():
    reports: list = []
    _compiled(0.0, reports)
    fw, bw, report = reports[0]
    assert any(n.target is run_and_save_rng_state for n in fw.graph.nodes)
    assert any(n.target is run_with_rng_state for n in bw.graph.nodes)
    assert "native_dropout" in {d.name for d in report.recomputed}


def test_op_counter_sees_the_traced_ops_plus_the_recompute():
    reports: list = []
    counts = {}
    for budget in (1.0, 0.0):
        call, module = _compiled(budget, reports)
        with OpCounter() as counter:
            _step(call, module, _input())
        counts[budget] = counter.counts
    _, bw, report = reports[-1]
    recomputed = Counter(str(n.target) for n in bw.graph.nodes if n.op == "call_function"
                         and n.name in {d.name for d in report.recomputed}
                         and n.target is not run_with_rng_state and "getitem" not in n.name)
    recomputed["aten.native_dropout.default"] += 1  # the replayed one, inside the operator
    extra = counts[0.0] - counts[1.0]
    # A saved value's detach goes with it when it is recomputed instead.
    extra.pop("aten.detach.default", None)
    assert extra == recomputed
    assert counts[0.0]["aten.native_dropout.default"] == 2


def test_op_counter_run_matches_eager():
    call, module = _compiled(0.0)
    eager = _model()
    want = _step(eager, eager, _input())
    with OpCounter():
        got = _step(call, module, _input())
    _assert_same_step(got, want)


def test_flop_counter_with_op_counter_counts_eager_plus_recompute():
    eager = _model()
    with FlopCounterMode(display=False) as flops:
        _step(eager, eager, _input())
    eager_flops = flops.get_total_flops()
    measured = {}
    for budget in (1.0, 0.0):
        call, module = _compiled(budget)
        with FlopCounterMode(display=False) as flops, OpCounter() as counter:
            _step(call, module, _input())
        measured[budget] = flops.get_total_flops()
        assert counter.counts["aten.addmm.default"] == (2 if budget == 1.0 else 3)
    assert measured == {1.0: eager_flops, 0.0: eager_flops + RECOMPUTED_FLOPS}


def test_a_mode_that_takes_higher_order_operators_sees_ours():
    call, module = _compiled(0.0)
    eager = _model()
    want = _step(eager, eager, _input())
    with HopRecorder() as recorder:
        got = _step(call, module, _input())
    assert recorder.counts["aot_partition_run_and_save_rng_state"] == 0  # str() is torch's
    assert recorder.counts["run_and_save_rng_state"] == 1
    assert recorder.counts["run_with_rng_state"] == 1
    _assert_same_step(got, want)


def _autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("context", [torch.autograd.detect_anomaly, _autocast, torch.no_grad],
                         ids=["anomaly", "autocast", "no_grad"])
def test_wrapped_runs_match_eager(context):
    call, module = _compiled(0.0)
    eager = _model()
    want = _step(eager, eager, _input(), context)
    got = _step(call, module, _input(), context)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if context is _autocast else {}
    _assert_same_step(got, want, **tolerance)


# ---- through torch.compile -------------------------------------------------------------------
# Dynamo runs a frame eagerly while a dispatch mode is active, so the compiled forward runs
# outside the mode; its backward (with the replay) runs under the mode around backward().

def _torch_compiled(budget: float):
    torch._dynamo.reset()
    module = _model()
    compiled = torch.compile(module, backend="aot_pipeline",
                             options={"compiler": "nop", "memory_budget": budget})
    return (lambda x: compiled(x)), module


def _backward_under(mode_factory, call, module):
    module.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = call(_input())
    loss = loss_of(out)
    with mode_factory() as mode:
        loss.backward()
    return mode, (out.detach(), {n: p.grad for n, p in module.named_parameters()})


def test_torch_compile_backward_under_op_counter_replays_once():
    # Compiled dropout draws its own masks (not eager's): budget 0.0 must give budget 1.0's
    # results, whose backward reuses the saved mask.
    counts, steps = {}, {}
    for budget in (1.0, 0.0):
        call, module = _torch_compiled(budget)
        _step(call, module, _input())
        counter, steps[budget] = _backward_under(OpCounter, call, module)
        counts[budget] = counter.counts
    _assert_same_step(steps[0.0], steps[1.0])
    assert counts[1.0]["aten.native_dropout.default"] == 0
    assert counts[0.0]["aten.native_dropout.default"] == 1
    assert counts[0.0]["aten.addmm.default"] == counts[1.0]["aten.addmm.default"] + 1


def test_torch_compile_backward_flops_are_eager_plus_recompute():
    eager = _model()
    out = eager(_input())
    with FlopCounterMode(display=False) as flops:
        loss_of(out).backward()
    eager_backward = flops.get_total_flops()
    measured = {}
    for budget in (1.0, 0.0):
        call, module = _torch_compiled(budget)
        _step(call, module, _input())
        counter, _ = _backward_under(lambda: FlopCounterMode(display=False), call, module)
        measured[budget] = counter.get_total_flops()
    assert measured == {1.0: eager_backward, 0.0: eager_backward + RECOMPUTED_FLOPS}


@pytest.mark.parametrize("context", [torch.autograd.detect_anomaly, _autocast, torch.no_grad],
                         ids=["anomaly", "autocast", "no_grad"])
def test_torch_compile_wrapped_runs_match_budget_one(context):
    # Budget 0.0 (dropout replayed) computes what budget 1.0 (mask saved) does, with the same
    # compiled random draws; both run wholly inside the wrapper.
    steps = {}
    for budget in (1.0, 0.0):
        call, module = _torch_compiled(budget)
        steps[budget] = _step(call, module, _input(), context)
    _assert_same_step(steps[0.0], steps[1.0])
