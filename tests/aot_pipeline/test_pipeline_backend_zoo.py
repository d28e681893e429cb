"""End to end on the zoo: compiled models compute eager's outputs and gradients."""

from __future__ import annotations

import aot_partition
import aot_pipeline
import pytest
import torch
from zoo import ZOO, assert_matches_eager, loss_of, make_case, run_with_grads


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("budget", [1.0, 0.3])
def test_zoo_matches_eager_with_nop_compiler(name, budget):
    compiled = {}

    def compile_fn(module):
        compiled["model"] = aot_pipeline.compile(module, compiler="nop", memory_budget=budget)
        return compiled["model"]

    assert_matches_eager(make_case(name), compile_fn)
    assert compiled["model"].partitions, "our partitioner never ran"


def as_function(compiled_module):
    """zoo.run_with_grads tests ``call or module``, and an OptimizedModule has no truth value
    in torch 2.13 (it proxies ``len()``): hand it a plain function instead."""
    return lambda *args: compiled_module(*args)


@pytest.mark.parametrize("name", ["mlp", "views"])
def test_registered_backend_name_matches_eager(name):
    assert_matches_eager(make_case(name), lambda m: as_function(torch.compile(
        m, backend="aot_pipeline", options={"compiler": "nop", "memory_budget": 0.5})))


def test_registered_backend_uses_our_partitioner(monkeypatch):
    calls = []
    ours = aot_partition.min_cut_rematerialization_partition

    def spy(*args, **kwargs):
        calls.append(kwargs.get("num_fwd_outputs"))
        return ours(*args, **kwargs)

    monkeypatch.setattr(aot_partition, "min_cut_rematerialization_partition", spy)
    assert_matches_eager(make_case("mlp"), lambda m: as_function(torch.compile(
        m, backend="aot_pipeline", options={"compiler": "nop"})))
    assert calls == [1]


def test_budget_reaches_the_partitioner():
    """A lower budget must save fewer bytes: the budget is not lost on the way."""
    saved = {}
    for budget in (1.0, 0.0):
        case = make_case("gpt")
        compiled = aot_pipeline.compile(case.module, compiler="nop", memory_budget=budget)
        run_with_grads(case.module, case.inputs, call=compiled)
        saved[budget] = compiled.saved_activation_bytes
    # At 0.0 everything is recomputed from the inputs, which cost nothing (alive anyway).
    assert saved[0.0] < saved[1.0] and saved[1.0] > 0, saved


def test_saved_bytes_are_those_of_the_forward_graph():
    case = make_case("mlp")
    compiled = aot_pipeline.compile(case.module, compiler="nop")
    run_with_grads(case.module, case.inputs, call=compiled)
    (partition,) = compiled.partitions
    assert compiled.saved_activation_bytes == aot_partition.saved_activation_bytes(
        partition.forward) > 0


@pytest.mark.parametrize("compiler", ["debug_nop", "print_compile", "ts_compile"])
def test_other_graph_compilers_match_eager(compiler):
    assert_matches_eager(make_case("mlp"), lambda m: aot_pipeline.compile(m, compiler=compiler))


def test_compiled_autograd_backward_matches_eager():
    import compiled_autograd

    case = make_case("gpt")
    reference = case.fresh()
    _, want, _ = run_with_grads(reference.module, reference.inputs)
    compiled = aot_pipeline.compile(case.module, compiler="nop", compiled_autograd=True,
                                    memory_budget=0.5)
    compiled_autograd.reset()
    torch.manual_seed(1234)
    compiled.backward(loss_of(compiled(*case.inputs)))
    assert compiled_autograd.counters()["runs"] == 1
    assert not compiled_autograd.is_enabled()
    for name, param in case.module.named_parameters():
        torch.testing.assert_close(param.grad, want[name], atol=1e-5, rtol=1e-4)


def test_backward_without_compiled_autograd_leaves_it_off():
    import compiled_autograd

    case = make_case("mlp")
    compiled = aot_pipeline.compile(case.module, compiler="nop")
    compiled_autograd.reset()
    compiled.backward(loss_of(compiled(*case.inputs)))
    assert compiled_autograd.counters()["runs"] == 0
    assert all(p.grad is not None for p in case.module.parameters())


def test_compiled_model_delegates_to_the_module():
    case = make_case("mlp")
    compiled = aot_pipeline.compile(case.module, compiler="nop")
    assert list(compiled.parameters()) == list(case.module.parameters())
    assert compiled.saved_activation_bytes is None  # nothing compiled yet
