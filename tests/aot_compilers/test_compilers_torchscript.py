"""TorchScript compilers: every step runs or fails loudly, naming the step."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from aot_compilers import (
    TorchScriptCompileError,
    TorchScriptUnavailableError,
    nnc_jit,
    strip_overloads,
    ts_compile,
)
from aot_compilers.torchscript import canonicalize_to_copy, devices_as_strings
from torch.fx.experimental.proxy_tensor import make_fx

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def cast_and_fill(x):
    y = x.to(torch.float64) * 2
    return y + torch.ones(3, device=x.device, dtype=torch.float64)


def test_ts_compile_runs_the_graph_and_returns_a_boxed_script():
    x = torch.randn(3)
    gm = make_fx(cast_and_fill)(x)
    compiled = ts_compile(gm, [x])
    assert compiled._boxed_call
    torch.testing.assert_close(compiled([x]), cast_and_fill(x))


def test_canonicalize_rewrites_dtype_only_to_copy_and_keeps_others():
    def two_casts(x):
        return x.to(torch.float64), x.to(device="cpu", dtype=torch.float16)

    gm = make_fx(two_casts)(torch.randn(3))
    to_copies = targets(gm).count(torch.ops.aten._to_copy.default)
    assert to_copies == 2
    canonicalize_to_copy(gm)
    assert targets(gm).count(torch.ops.aten.to) == 1
    assert targets(gm).count(torch.ops.aten._to_copy.default) == 1


def test_device_kwargs_become_strings_keeping_the_index():
    graph = fx.Graph()
    x = graph.placeholder("x")
    ones = graph.call_function(torch.ops.aten.ones.default, ([3],),
                               {"device": torch.device("cuda", 1), "dtype": torch.float32})
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (x, ones)))
    gm = devices_as_strings(fx.GraphModule({}, graph))
    assert ones.kwargs == {"device": "cuda:1", "dtype": torch.float32}
    assert "device(" not in gm.code


def test_strip_overloads_uses_packets():
    gm = strip_overloads(make_fx(cast_and_fill)(torch.randn(3)))
    assert all(isinstance(t, torch._ops.OpOverloadPacket) for t in targets(gm))


def test_jit_autocast_is_off_during_scripting_and_restored(monkeypatch):
    seen = []
    real_script = torch.jit.script

    def spying_script(obj, *args, **kwargs):
        current = torch._C._jit_set_autocast_mode(False)
        torch._C._jit_set_autocast_mode(current)
        seen.append(current)
        return real_script(obj, *args, **kwargs)

    monkeypatch.setattr(torch.jit, "script", spying_script)
    previous = torch._C._jit_set_autocast_mode(True)
    try:
        ts_compile(make_fx(cast_and_fill)(torch.randn(3)), [torch.randn(3)])
        assert torch._C._jit_set_autocast_mode(True) is True  # restored afterwards
    finally:
        torch._C._jit_set_autocast_mode(previous)
    assert seen == [False]


def test_missing_torchscript_step_fails_naming_it(monkeypatch):
    monkeypatch.delattr(torch.jit, "optimize_for_inference")
    with pytest.raises(TorchScriptUnavailableError,
                       match=r"torch\.jit\.optimize_for_inference is not available in torch 2\."):
        ts_compile(make_fx(cast_and_fill)(torch.randn(3)), [torch.randn(3)])


def _unscriptable(x, *rest, **options):
    return x + len(options)


def test_failing_step_is_named():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(_unscriptable, (x,)))
    gm = fx.GraphModule({}, graph)
    with pytest.raises(TorchScriptCompileError,
                       match=r"ts_compile step 'torch\.jit\.script' failed on torch 2\.\d+"):
        ts_compile(gm, [torch.randn(3)])


def test_nnc_jit_outputs_and_gradients_match_eager():
    def f(x, w):
        return torch.tanh(x @ w).sum(-1)

    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    compiled = nnc_jit(f)
    out = compiled(x, w)
    ref = f(x, w)
    torch.testing.assert_close(out, ref)
    got = torch.autograd.grad(out.sum(), (x, w))
    want = torch.autograd.grad(ref.sum(), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)
