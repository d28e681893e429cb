"""torch.compile(backend="aot_pipeline") honours torch._functorch.config's budget (issue 27)."""

from __future__ import annotations

import contextlib

import aot_partition
import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import FlagConflictError, saved_activation_bytes
from torch._functorch import config as torch_config

from tests.zoo import make_case


@pytest.fixture
def saved_by_backend(monkeypatch):
    """Compile the gpt case with backend="aot_pipeline" (nop compilers), run a step, return
    the bytes our partitioner's forward saved."""
    saved: list[int] = []
    partition = aot_partition.min_cut_rematerialization_partition

    def recording(joint, inputs, **kwargs):
        fw, bw = partition(joint, inputs, **kwargs)
        saved.append(saved_activation_bytes(fw, kwargs["num_fwd_outputs"]))
        return fw, bw

    monkeypatch.setattr(aot_partition, "min_cut_rematerialization_partition", recording)

    def run() -> int:
        saved.clear()
        case = make_case("gpt")
        torch._dynamo.reset()
        model = torch.compile(case.module, backend="aot_pipeline", options={"compiler": "nop"})
        model(*case.inputs).sum().backward()
        assert len(saved) == 1
        return saved[0]

    return run


def test_torchs_budget_is_honoured_by_the_backend(saved_by_backend):
    full = saved_by_backend()
    with functorch_config.patch(activation_memory_budget=0.5):
        ours = saved_by_backend()
    with torch_config.patch(activation_memory_budget=0.5):
        theirs = saved_by_backend()
    assert theirs == ours < full


def test_nothing_set_is_unchanged(saved_by_backend):
    from aot_pipeline.backend import default_options
    from aot_pipeline.options import PipelineOptions

    assert default_options() == PipelineOptions()
    assert saved_by_backend() > 0


def test_a_conflict_is_reported_at_compile_time(saved_by_backend):
    with torch_config.patch(activation_memory_budget=0.5), \
            functorch_config.patch(activation_memory_budget=0.25), \
            pytest.raises(Exception) as info:
        saved_by_backend()
    # torch.compile wraps a back end's error in BackendCompilerFailed.
    assert isinstance(getattr(info.value, "inner_exception", info.value), FlagConflictError)
    assert ("torch._functorch.config.activation_memory_budget = 0.5 and "
            "aot_config.functorch.activation_memory_budget = 0.25: both are set and they "
            "differ") in str(info.value)


@pytest.mark.skipif(not hasattr(torch.autograd.graph, "region_activation_memory_budget"),
                    reason="region_activation_memory_budget needs torch 2.13+")
def test_region_budgets_reach_the_backend(monkeypatch):
    """Through backend="aot_pipeline": a region 0.0 over the whole forward saves less than
    none, and two regions with different budgets compile and give eager's gradients."""
    saved: list[int] = []
    partition = aot_partition.min_cut_rematerialization_partition

    def recording(joint, inputs, **kwargs):
        fw, bw = partition(joint, inputs, **kwargs)
        saved.append(saved_activation_bytes(fw, kwargs["num_fwd_outputs"]))
        return fw, bw

    monkeypatch.setattr(aot_partition, "min_cut_rematerialization_partition", recording)

    def region(budget):
        if budget is None or not torch.compiler.is_compiling():
            return contextlib.nullcontext()
        if isinstance(budget, float):
            return torch.autograd.graph.region_activation_memory_budget(budget)
        return aot_partition.region_memory_budget(budget)

    def model(budgets, whole=None):
        def fn(x, w1, w2):
            with region(whole):
                with region(budgets[0]):
                    h = torch.relu(x @ w1).sin().cos()
                with region(budgets[1]):
                    h = torch.relu(h @ w2).sin().cos()
                return h.sum()
        return fn

    def step(fn):
        gen = torch.Generator().manual_seed(0)
        args = [torch.randn(32, 32, generator=gen, requires_grad=True) for _ in range(3)]
        torch._dynamo.reset()
        torch.compile(fn, backend="aot_pipeline", options={"compiler": "nop"})(*args).backward()
        return [a.grad for a in args]

    step(model([None, None]))
    step(model([None, None], whole=0.0))
    assert saved[1] < saved[0]
    grads = step(model([0.0, "2KiB"]))
    gen = torch.Generator().manual_seed(0)
    eager = [torch.randn(32, 32, generator=gen, requires_grad=True) for _ in range(3)]
    model([None, None])(*eager).backward()
    for got, want in zip(grads, eager):
        torch.testing.assert_close(got, want.grad)


def test_compile_with_a_budget_under_torchs_different_flag_is_a_conflict():
    import aot_pipeline

    case = make_case("gpt")
    torch._dynamo.reset()
    model = aot_pipeline.compile(case.module, memory_budget=0.7, compiler="nop")
    with torch_config.patch(activation_memory_budget=0.5), pytest.raises(Exception) as info:
        model(*case.inputs)
    assert isinstance(getattr(info.value, "inner_exception", info.value), FlagConflictError)
    assert "aot_config.functorch.activation_memory_budget = 0.7" in str(info.value)
