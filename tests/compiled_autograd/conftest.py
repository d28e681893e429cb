"""Fixtures for the compiled_autograd tests: a clean engine and a graph-recording compiler."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import compiled_autograd
import pytest
import torch
from torch import fx


class GraphRecorder:
    """A ``compiler_fn`` that runs the captured graph as is and keeps every graph it saw."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule) -> fx.GraphModule:
        self.graphs.append(gm)
        return gm

    def targets(self, index: int = -1) -> list[Any]:
        return [n.target for n in self.graphs[index].graph.nodes if n.op == "call_function"]


@pytest.fixture(autouse=True)
def clean_engine() -> Iterator[None]:
    compiled_autograd.reset()
    yield
    compiled_autograd.reset()


@pytest.fixture
def recorder() -> GraphRecorder:
    return GraphRecorder()


def _grads(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
           forward: Callable[..., Any], loss_of: Callable[[Any], torch.Tensor]) -> dict:
    inputs = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs)
    module.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    loss_of(forward(*inputs)).backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    grads.update({f"input{i}": t.grad.clone() for i, t in enumerate(inputs)
                  if t.grad is not None})
    return grads


@pytest.fixture
def compare_backward() -> Callable[..., dict]:
    """``compare_backward(case, compiler_fn, forward=None, **enable_kw)``: run the zoo case's
    backward once in eager and once under ``compiled_autograd.enable``; assert equal parameter
    and input gradients (and buffers, e.g. batch-norm statistics). Returns the compiled grads."""
    from zoo import loss_of

    def run(case: Any, compiler_fn: Callable[..., Any],
            forward: Callable[[torch.nn.Module], Callable[..., Any]] | None = None,
            atol: float = 1e-5, rtol: float = 1e-4, **enable_kw: Any) -> dict:
        eager, compiled = case.fresh(), case.fresh()
        want = _grads(eager.module, eager.inputs, eager.module, loss_of)
        call = forward(compiled.module) if forward is not None else compiled.module
        with compiled_autograd.enable(compiler_fn, **enable_kw):
            got = _grads(compiled.module, compiled.inputs, call, loss_of)
        assert got.keys() == want.keys(), (sorted(got), sorted(want))
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=atol, rtol=rtol,
                                       msg=lambda m, name=name: f"grad of {name}: {m}")
        for (name, got_buf), want_buf in zip(compiled.module.named_buffers(),
                                             eager.module.buffers()):
            torch.testing.assert_close(got_buf, want_buf, msg=lambda m, n=name: f"{n}: {m}")
        return got

    return run
