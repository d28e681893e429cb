"""The aot_config flag turns compiled autograd on through our helpers; graphs are logged."""

from __future__ import annotations

import logging

import compiled_autograd
import pytest
import torch
from aot_config import dynamo as dynamo_config
from torch import nn


def _model_and_input() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)), torch.randn(3, 4)


def test_flag_off_means_no_op(recorder):
    model, x = _model_and_input()
    assert dynamo_config.compiled_autograd is False
    with compiled_autograd.maybe_enable_from_config(recorder):
        assert not compiled_autograd.is_enabled()
        model(x).sum().backward()
    assert recorder.graphs == []


def test_flag_on_enables_our_engine(recorder):
    model, x = _model_and_input()
    with dynamo_config.patch(compiled_autograd=True):
        with compiled_autograd.maybe_enable_from_config(recorder):
            assert compiled_autograd.is_enabled()
            model(x).sum().backward()
    assert len(recorder.graphs) == 1
    assert not compiled_autograd.is_enabled()


def test_flag_on_defaults_to_inductor():
    with dynamo_config.patch(compiled_autograd=True):
        context = compiled_autograd.maybe_enable_from_config()
    with context:
        from compiled_autograd.state import CompilerFactory

        factory, _ = compiled_autograd.protocol.installed_compiler()
        assert isinstance(factory, CompilerFactory)
        assert factory.compiler_fn is compiled_autograd.inductor_compiler


def test_compile_wrapper_captures_backward_inside_the_compiled_call(recorder):
    torch._dynamo.reset()
    model, x = _model_and_input()
    want = torch.autograd.grad(model(x).sum(), list(model.parameters()))

    def train_step(inp):
        loss = model(inp).sum()
        loss.backward()  # Dynamo breaks the graph here; the C++ engine runs the backward
        return loss.detach()

    step = compiled_autograd.compile(train_step, compiler_fn=recorder, backend="eager")
    model.zero_grad()
    step(x)
    assert recorder.graphs == [], "flag off when compiled: eager backward"
    with dynamo_config.patch(compiled_autograd=True):
        step = compiled_autograd.compile(train_step, compiler_fn=recorder, backend="eager")
    model.zero_grad()
    step(x)  # the flag was on when compile() ran (see test_ca_flag_at_compile.py)
    assert len(recorder.graphs) == 1
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w)
    torch._dynamo.reset()


def test_graph_is_logged_at_info(caplog, recorder):
    model, x = _model_and_input()
    with caplog.at_level(logging.INFO, logger="compiled_autograd.graph"):
        with compiled_autograd.enable(recorder):
            model(x).sum().backward()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "compiled_autograd.graph")
    assert "compiled autograd graph" in text
    assert "def forward(self, inputs, sizes, scalars, hooks, packed_data)" in text
    assert "TanhBackward0" in text


def test_verbose_logger_gets_engine_messages(caplog, recorder):
    model, x = _model_and_input()
    with caplog.at_level(logging.DEBUG, logger="compiled_autograd.verbose"):
        with compiled_autograd.enable(recorder):
            model(x).sum().backward()
    verbose = [r.getMessage() for r in caplog.records if r.name == "compiled_autograd.verbose"]
    assert verbose, "the C++ engine reports its cache miss through our verbose logger"
    assert any("Cache miss" in m or "cache miss" in m.lower() for m in verbose)


@pytest.mark.parametrize("bad,type_name", [(None, "NoneType"), (3, "int")])
def test_compile_wrapper_rejects_non_callable(bad, type_name):
    with pytest.raises(TypeError, match=f"expects a function or nn.Module, got {type_name}"):
        compiled_autograd.compile(bad)
