"""``compiled_autograd.compile`` reads ``aot_config.dynamo.compiled_autograd`` once, when called.

That is when ``torch.compile`` reads ``torch._dynamo.config.compiled_autograd`` too, so code
ported from torch (flag patched around the compile call, steps run outside the patch) keeps
capturing. The torch half of each pair below shows the behaviour we copy.
"""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from aot_config import dynamo as dynamo_config
from compiled_autograd.state import CompilerFactory
from torch import nn
from torch._dynamo.utils import counters as torch_counters


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model_and_step() -> tuple[nn.Module, torch.Tensor, object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))

    def train_step(inp):
        loss = model(inp).sum()
        loss.backward()  # Dynamo breaks the graph here; the C++ engine runs the backward
        return loss.detach()

    return model, torch.randn(3, 4), train_step


def _torch_captures() -> int:
    return int(torch_counters["compiled_autograd"]["captures"])


def test_flag_on_at_compile_keeps_capturing_after_the_patch(recorder):
    model, x, train_step = _model_and_step()
    want = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    with dynamo_config.patch(compiled_autograd=True):
        step = compiled_autograd.compile(train_step, compiler_fn=recorder, backend="eager")
    assert dynamo_config.compiled_autograd is False
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        step(x)
        for p, w in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, w)
    assert len(recorder.graphs) == 1, "captured at the first call, reused after"
    assert compiled_autograd.counters() == {"captures": 1, "compiles": 1, "runs": 3}
    assert not compiled_autograd.is_enabled(), "only inside the compiled call"


def test_torch_also_fixes_its_flag_when_torch_compile_is_called():
    model, x, train_step = _model_and_step()
    with torch._dynamo.config.patch(compiled_autograd=True):
        step = torch.compile(train_step, backend="eager")
    torch_counters.clear()
    step(x)
    assert _torch_captures() == 1


def test_flag_off_at_compile_never_captures(recorder):
    model, x, train_step = _model_and_step()
    step = compiled_autograd.compile(train_step, compiler_fn=recorder, backend="eager")
    with dynamo_config.patch(compiled_autograd=True):
        step(x)
    assert recorder.graphs == []
    assert compiled_autograd.counters()["captures"] == 0
    assert model[0].weight.grad is not None, "the eager engine ran the backward"


def test_torch_also_ignores_its_flag_turned_on_after_torch_compile():
    model, x, train_step = _model_and_step()
    step = torch.compile(train_step, backend="eager")
    torch_counters.clear()
    with torch._dynamo.config.patch(compiled_autograd=True):
        step(x)
    assert _torch_captures() == 0


def test_the_compiler_is_chosen_at_compile_time():
    seen = []

    @torch._dynamo.disable
    def probe():
        seen.append(compiled_autograd.protocol.installed_compiler()[0])

    def fn(x):
        probe()
        return x + 1

    with dynamo_config.patch(compiled_autograd=True):
        step = compiled_autograd.compile(fn, backend="eager")
    step(torch.ones(2))
    step(torch.ones(2))
    assert len(seen) == 2
    for factory in seen:
        assert isinstance(factory, CompilerFactory)
        assert factory.compiler_fn is compiled_autograd.inductor_compiler
    assert not compiled_autograd.is_enabled()


def test_both_flags_on_at_compile_is_refused():
    _, _, train_step = _model_and_step()
    with dynamo_config.patch(compiled_autograd=True), \
            torch._dynamo.config.patch(compiled_autograd=True):
        with pytest.raises(compiled_autograd.CompiledAutogradConflictError):
            compiled_autograd.compile(train_step, backend="eager")
