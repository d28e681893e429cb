"""Dynamic shapes through the aot_pipeline back end: correct at every batch size, one compile.

With ``dynamic=True`` or ``torch._dynamo.mark_dynamic`` the batch size is symbolic, so new sizes
reuse the compiled graph instead of recompiling per size (what backend="inductor" does too).
"""

from __future__ import annotations

import copy

import aot_pipeline  # noqa: F401  (registers the back end)
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

BATCHES = (3, 5, 8, 11)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 4))


def _step(module: nn.Module, call, x: torch.Tensor, mark_dynamic: bool = False):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    if mark_dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    out = call(x)
    out.pow(2).mean().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def _compiles(backend: str, options: dict | None, how: str) -> tuple[int, list]:
    """(graphs compiled over all batch sizes, per-size (got, want) step results)."""
    torch._dynamo.reset()
    counters.clear()
    eager, compiled_model = _model(), _model()
    compiled = torch.compile(compiled_model, backend=backend, options=options,
                             dynamic=True if how == "dynamic" else None)
    results = []
    for batch in BATCHES:
        torch.manual_seed(batch)
        x = torch.randn(batch, 12)
        results.append((_step(compiled_model, compiled, x, how == "mark_dynamic"),
                        _step(eager, eager, x)))
    torch._dynamo.reset()
    return counters["stats"]["unique_graphs"], results


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
@pytest.mark.parametrize("compiler", ["nop", pytest.param("inductor", marks=pytest.mark.slow)])
def test_batch_sizes_share_one_compile_and_match_eager(compiler, how):
    graphs, results = _compiles("aot_pipeline", {"compiler": compiler}, how)
    assert graphs == 1, f"{graphs} graphs compiled for batch sizes {BATCHES}"
    for (out, x_grad, grads), (ref_out, ref_x_grad, ref_grads) in results:
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(x_grad, ref_x_grad, atol=1e-5, rtol=1e-4)
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4)


def test_static_shapes_recompile_per_size_as_inductor_does():
    # The opposite case: without dynamic shapes the first size is specialized, and Dynamo's
    # automatic dynamic shapes make the second size recompile once, as with "inductor".
    ours, _ = _compiles("aot_pipeline", {"compiler": "nop"}, "static")
    torch._dynamo.reset()
    counters.clear()
    model = copy.deepcopy(_model())
    compiled = torch.compile(model, backend="eager")
    for batch in BATCHES:
        compiled(torch.randn(batch, 12))
    assert ours == counters["stats"]["unique_graphs"] == 2
