"""Errors name their cause and leave the engine clean; nesting and torch's flag are explicit."""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from compiled_autograd import protocol
from torch import nn


def _model_and_input() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)), torch.randn(3, 4)


def broken_compiler(gm):
    raise ValueError("backend exploded")


def test_compiler_fn_exception_propagates_with_context_and_disables():
    model, x = _model_and_input()
    with pytest.raises(compiled_autograd.CompilerFnError,
                       match=r"compiler_fn 'broken_compiler' failed on compiled-autograd graph "
                             r"CompiledAutograd\d+ .*ValueError: backend exploded") as info:
        with compiled_autograd.enable(broken_compiler):
            model(x).sum().backward()
    assert isinstance(info.value.__cause__, ValueError)
    assert not compiled_autograd.is_enabled()
    assert protocol.installed_compiler() == (None, False)
    # plain eager backward still works, and compiled autograd can be enabled again
    model.zero_grad()
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with compiled_autograd.enable(lambda gm: gm):
        model(x).sum().backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w)


def test_exception_inside_the_block_restores_the_prior_compiler():
    with pytest.raises(KeyError, match="boom"):
        with compiled_autograd.enable(lambda gm: gm):
            assert compiled_autograd.is_enabled()
            raise KeyError("boom")
    assert not compiled_autograd.is_enabled()


def test_non_callable_compiler_is_refused():
    with pytest.raises(TypeError, match="compiler_fn must be callable, got str"):
        with compiled_autograd.enable("inductor"):
            pass


def test_disable_runs_eagerly_inside_enable(recorder):
    model, x = _model_and_input()
    with compiled_autograd.enable(recorder):
        with compiled_autograd.disable():
            assert not compiled_autograd.is_enabled()
            model(x).sum().backward()
        assert compiled_autograd.is_enabled()
    assert recorder.graphs == []


def test_nested_enable_uses_the_inner_compiler_then_the_outer_again():
    model, x = _model_and_input()
    seen: list[str] = []

    def outer(gm):
        seen.append("outer")
        return gm

    def inner(gm):
        seen.append("inner")
        return gm

    with compiled_autograd.enable(outer):
        model(x).sum().backward()
        with compiled_autograd.enable(inner):
            model(x).sum().backward()  # same graph shape: must NOT reuse outer's graph
        model(x).sum().backward()  # back to outer: must NOT reuse inner's graph
    assert seen == ["outer", "inner", "outer"]


@pytest.mark.parametrize("version", ["2.10.0", "2.16.0", "3.0.0+cpu", "1.13.1"])
def test_unsupported_torch_release_is_refused(version):
    with pytest.raises(compiled_autograd.UnsupportedTorchError,
                       match=rf"supports torch 2\.11 to 2\.15; the installed torch is "
                             rf"{version.replace('+', '.')}"):
        protocol.protocol_for(version)


@pytest.mark.parametrize("version,passes_grad", [("2.11.0", False), ("2.13.0+cu130", True),
                                                 ("2.15.0", True)])
def test_supported_releases_have_a_protocol(version, passes_grad):
    assert protocol.protocol_for(version).accumulate_grad_passes_current_grad is passes_grad


@pytest.mark.parametrize("version", ["2.11.0", "2.13.0", "2.15.0"])
def test_accumulate_grad_call_is_read_per_release(version):
    # Each release's engine calls accumulate_grad its own way; protocol.py alone knows which.
    release = protocol.protocol_for(version)
    variable, current, grad = object(), object(), object()
    if release.accumulate_grad_passes_current_grad:
        call = release.unpack_accumulate_grad((variable, current, grad, True))
        assert (call.variable_grad, call.read_current_grad_at_run_time) == (current, False)
        assert release.accumulate_grad_reply(grad) is grad
        wrong = (variable, grad, True)
    else:
        call = release.unpack_accumulate_grad((variable, grad, True))
        assert (call.variable_grad, call.read_current_grad_at_run_time) == (None, True)
        assert release.accumulate_grad_reply(grad) is None
        wrong = (variable, current, grad, True)
    assert (call.variable, call.grad, call.has_post_hooks) == (variable, grad, True)
    with pytest.raises(RuntimeError, match=rf"accumulate_grad got {len(wrong)} arguments"):
        release.unpack_accumulate_grad(wrong)


def test_unparseable_version_is_refused():
    with pytest.raises(compiled_autograd.UnsupportedTorchError, match="cannot parse"):
        protocol.protocol_for("nightly")


def test_torch_own_compiled_autograd_flag_conflicts():
    import torch._dynamo.config

    # config.patch, not monkeypatch: monkeypatch's undo deletes the entry from torch's config
    # module, and every later Dynamo trace then fails on the missing flag.
    with torch._dynamo.config.patch(compiled_autograd=True):
        with pytest.raises(compiled_autograd.CompiledAutogradConflictError,
                           match="torch._dynamo.config.compiled_autograd is True"):
            with compiled_autograd.enable(lambda gm: gm):
                pass
    assert torch._dynamo.config.compiled_autograd is False
    assert not compiled_autograd.is_enabled()


def test_reset_inside_a_running_graph_is_refused():
    model, x = _model_and_input()
    errors: list[str] = []

    def hook(grad):
        try:
            compiled_autograd.reset()
        except RuntimeError as error:
            errors.append(str(error))
        return grad

    x.requires_grad_()
    x.register_hook(hook)
    with compiled_autograd.enable(lambda gm: gm):
        model(x).sum().backward()
    assert errors and "while a compiled backward runs" in errors[0]
