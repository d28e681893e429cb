"""Whole-model backwards under compiled autograd match eager, as one graph."""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from compiled_autograd.graph_ops import call_accumulate_grad
from zoo import make_case


@pytest.mark.parametrize("name", ["mlp", "gpt", "gpt_sdpa", "llama", "convnet", "views"])
def test_eager_forward_backward_matches_eager(name, compare_backward, recorder):
    case = make_case(name)
    compare_backward(case, recorder)
    assert len(recorder.graphs) == 1, "the whole backward must arrive as one graph"
    assert compiled_autograd.counters()["captures"] == 1
    leaves = sum(1 for p in case.module.parameters() if p.requires_grad)
    leaves += sum(1 for t in case.inputs if t.is_floating_point())  # inputs get .grad too
    assert recorder.targets().count(call_accumulate_grad) == leaves


def test_convnet_batch_norm_statistics_and_grads_match(compare_backward, recorder):
    case = make_case("convnet")
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in case.module.modules())
    grads = compare_backward(case, recorder)
    assert any("norm" in name or "bn" in name for name in grads) or len(grads) > 4


def test_dropout_runs_and_produces_finite_grads(recorder):
    case = make_case("dropout")
    x = case.inputs[0].clone().requires_grad_()
    with compiled_autograd.enable(recorder):
        case.module(x).pow(2).mean().backward()
    assert len(recorder.graphs) == 1
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in case.module.parameters())


def test_autograd_grad_returns_grads_instead_of_accumulating(recorder):
    case = make_case("mlp")
    x = case.inputs[0].clone().requires_grad_()
    params = list(case.module.parameters())
    want = torch.autograd.grad(case.module(x).pow(2).sum(), [x, *params])
    with compiled_autograd.enable(recorder):
        got = torch.autograd.grad(case.module(x).pow(2).sum(), [x, *params])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert all(p.grad is None for p in params)
    assert call_accumulate_grad not in recorder.targets()


def test_grads_accumulate_into_existing_grad_like_eager(recorder):
    case = make_case("mlp")
    eager, compiled = case.fresh(), case.fresh()
    for _ in range(2):
        eager.module(*eager.inputs).sum().backward()
    with compiled_autograd.enable(recorder):
        for _ in range(2):
            compiled.module(*compiled.inputs).sum().backward()
    for p, q in zip(compiled.module.parameters(), eager.module.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
