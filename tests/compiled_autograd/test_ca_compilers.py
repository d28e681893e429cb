"""compiler_fn may be the nop compiler of aot_compilers, Inductor, or a compiler that fails."""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from zoo import loss_of, make_case


def test_aot_compilers_nop_as_compiler_fn(compare_backward):
    nop = pytest.importorskip("aot_compilers").nop
    compare_backward(make_case("gpt"), nop)
    assert compiled_autograd.counters()["compiles"] == 1


def test_two_argument_compiler_gets_an_empty_example_list():
    seen = []

    def aot_style(gm, example_inputs):
        seen.append(example_inputs)
        return gm

    p = torch.nn.Parameter(torch.ones(3))
    with compiled_autograd.enable(aot_style):
        (p * 3).sum().backward()
    assert seen == [[]]
    torch.testing.assert_close(p.grad, torch.full((3,), 3.0))


@pytest.mark.slow
def test_inductor_compiler_fn_matches_eager_and_hits_the_cache(compare_backward):
    torch._dynamo.reset()
    case = make_case("mlp")
    compare_backward(case, compiled_autograd.inductor_compiler)
    # second step, new module copy with the same shapes: served from the cache
    again = case.fresh()
    with compiled_autograd.enable(compiled_autograd.inductor_compiler):
        x = again.inputs[0].clone().requires_grad_()  # as in compare_backward
        loss_of(again.module(x)).backward()
    assert compiled_autograd.counters()["captures"] == 1
    assert compiled_autograd.counters()["runs"] == 2
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_forward_with_inductor_backward_matches_eager():
    """Dynamo traces the pasted AOT backward (its prologue once tripped on FX immutable lists)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x = torch.randn(3, 4)
    want = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    forward = torch.compile(model, backend="aot_eager")
    with compiled_autograd.enable(compiled_autograd.inductor_compiler):
        forward(x).sum().backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w)
    torch._dynamo.reset()
