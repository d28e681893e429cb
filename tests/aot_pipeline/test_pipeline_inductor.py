"""Inductor as the compiler: our partitioner replaces Inductor's (two compiles, kept tiny)."""

from __future__ import annotations

import aot_pipeline
import pytest
import torch
from zoo import assert_matches_eager, make_case


def _refuse_inductor_partitioner(*args, **kwargs):
    raise AssertionError("Inductor's own min-cut partitioner was called")


@pytest.mark.slow
def test_inductor_with_our_partitioner_matches_eager(monkeypatch):
    import torch._inductor.compile_fx as inductor_compile_fx

    monkeypatch.setattr(inductor_compile_fx, "min_cut_rematerialization_partition",
                        _refuse_inductor_partitioner)
    compiled = {}

    def compile_fn(module):
        compiled["model"] = aot_pipeline.compile(module, compiler="inductor", memory_budget=0.5)
        return compiled["model"]

    assert_matches_eager(make_case("mlp"), compile_fn, atol=1e-4, rtol=1e-3)
    assert compiled["model"].saved_activation_bytes > 0


@pytest.mark.slow
def test_registered_backend_with_inductor_matches_eager(monkeypatch):
    import torch._inductor.compile_fx as inductor_compile_fx

    monkeypatch.setattr(inductor_compile_fx, "min_cut_rematerialization_partition",
                        _refuse_inductor_partitioner)

    def compile_fn(module):
        compiled = torch.compile(module, backend="aot_pipeline")
        # A plain function: zoo.run_with_grads tests ``call or module``, and an OptimizedModule
        # has no truth value in torch 2.13 (it proxies len()).
        return lambda *args: compiled(*args)

    assert_matches_eager(make_case("views"), compile_fn, atol=1e-4, rtol=1e-3)


@pytest.mark.cuda
def test_inductor_on_cuda_matches_eager():
    case = make_case("llama")
    case.module.cuda()
    case.inputs = tuple(t.cuda() for t in case.inputs)
    assert_matches_eager(case, lambda m: aot_pipeline.compile(m, memory_budget=0.5),
                         atol=1e-3, rtol=1e-3)


@pytest.mark.slow
def test_compiled_autograd_with_inductor_matches_eager():
    from zoo import loss_of, run_with_grads

    case = make_case("mlp")
    reference = case.fresh()
    _, want, _ = run_with_grads(reference.module, reference.inputs)
    compiled = aot_pipeline.compile(case.module, compiled_autograd=True)
    compiled.backward(loss_of(compiled(*case.inputs)))
    for name, param in case.module.named_parameters():
        torch.testing.assert_close(param.grad, want[name], atol=1e-4, rtol=1e-3)
