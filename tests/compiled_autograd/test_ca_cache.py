"""Cache hits capture nothing; new shapes run dynamically or recapture, and stay correct."""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from torch import nn


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))


def _eager_grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(model(x).pow(2).sum(), list(model.parameters())))


def _step(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_second_step_with_same_shapes_captures_nothing(recorder):
    model, x = _mlp(), torch.randn(4, 8)
    with compiled_autograd.enable(recorder):
        first = _step(model, x)
        after_first = compiled_autograd.counters()
        second = _step(model, x)
    assert after_first["captures"] == 1
    assert compiled_autograd.counters() == {"captures": 1, "compiles": 1, "runs": 2}
    assert len(recorder.graphs) == 1
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)


def test_reentering_enable_with_the_same_compiler_reuses_the_cache(recorder):
    model, x = _mlp(), torch.randn(4, 8)
    for _ in range(3):
        with compiled_autograd.enable(recorder):
            _step(model, x)
    assert compiled_autograd.counters()["captures"] == 1


class _Owner:
    """Hands ``enable`` ``self.compile_backward``: a new bound-method object at every access."""

    def __init__(self) -> None:
        self.calls = 0

    def compile_backward(self, gm):
        self.calls += 1
        return gm


def test_a_bound_method_given_again_is_the_same_compiler():
    model, x, owner = _mlp(), torch.randn(4, 8), _Owner()
    assert owner.compile_backward is not owner.compile_backward
    for _ in range(5):
        with compiled_autograd.enable(owner.compile_backward):
            _step(model, x)
    assert compiled_autograd.counters() == {"captures": 1, "compiles": 1, "runs": 5}
    assert owner.calls == 1


def test_the_same_method_on_another_instance_is_another_compiler():
    model, x = _mlp(), torch.randn(4, 8)
    first, second = _Owner(), _Owner()
    for owner in (first, second, first):
        with compiled_autograd.enable(owner.compile_backward):
            _step(model, x)
    assert compiled_autograd.counters()["captures"] == 3
    assert (first.calls, second.calls) == (2, 1)


def test_same_compiler():
    owner, other = _Owner(), _Owner()
    assert compiled_autograd.same_compiler(owner.compile_backward, owner.compile_backward)
    assert not compiled_autograd.same_compiler(owner.compile_backward, other.compile_backward)
    assert not compiled_autograd.same_compiler(owner.compile_backward, _Owner.compile_backward)
    assert compiled_autograd.same_compiler(_mlp, _mlp)
    assert not compiled_autograd.same_compiler(None, _mlp)
    assert not compiled_autograd.same_compiler(lambda gm: gm, lambda gm: gm)


def test_new_batch_size_runs_the_dynamic_graph_and_is_correct(recorder):
    model = _mlp()
    with compiled_autograd.enable(recorder, dynamic=True):
        _step(model, torch.randn(4, 8))
        x = torch.randn(7, 8)
        got = _step(model, x)
    assert compiled_autograd.counters()["captures"] == 1, "dynamic sizes need no recapture"
    for g, w in zip(got, _eager_grads(model, x)):
        torch.testing.assert_close(g, w)


def test_static_capture_recaptures_on_a_new_shape_and_is_correct(recorder):
    model = _mlp()
    with compiled_autograd.enable(recorder, dynamic=False):
        _step(model, torch.randn(4, 8))
        x = torch.randn(7, 8)
        got = _step(model, x)
        assert compiled_autograd.counters()["captures"] == 2
        _step(model, torch.randn(9, 8))  # the recapture marked the batch size dynamic
    assert compiled_autograd.counters()["captures"] == 2
    for g, w in zip(got, _eager_grads(model, x)):
        torch.testing.assert_close(g, w)


def test_reset_clears_cache_and_counters(recorder):
    model, x = _mlp(), torch.randn(4, 8)
    with compiled_autograd.enable(recorder):
        _step(model, x)
    compiled_autograd.reset()
    assert compiled_autograd.counters() == {"captures": 0, "compiles": 0, "runs": 0}
    with compiled_autograd.enable(recorder):
        _step(model, x)
    assert compiled_autograd.counters()["captures"] == 1
    assert len(recorder.graphs) == 2


@pytest.mark.parametrize("dynamic", ["yes", 1])
def test_dynamic_must_be_a_bool(dynamic):
    with pytest.raises(TypeError, match="dynamic must be a bool"):
        with compiled_autograd.enable(lambda gm: gm, dynamic=dynamic):
            pass
