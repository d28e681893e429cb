"""``aot_pipeline.compile(model, compiled_autograd=True)`` keeps its backward capture over steps.

``CompiledModel.backward`` enters ``compiled_autograd.enable(self._backward_compiler)`` at every
step, a new bound-method object each time. The engine once compared cache owners by identity,
so it cleared its graph cache and recaptured (and, with Inductor, recompiled) the whole backward
at every step. Here a training loop of 10 steps with the same shapes captures exactly as often as
torch's own compiled autograd on the same model (1, or 2 when step 2 first accumulates into
existing ``.grad``s), trains exactly like eager, and still recaptures when the backward changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import aot_pipeline
import compiled_autograd
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters as torch_counters

STEPS = 10


@pytest.fixture(autouse=True)
def clean_engine():
    compiled_autograd.reset()
    yield
    compiled_autograd.reset()


def _make_model(dropout: float) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(8, 16), nn.GELU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(16, 4))
    return nn.Sequential(*layers)


def _batches(batch: int = 4) -> list[torch.Tensor]:
    return [torch.randn(batch, 8, generator=torch.Generator().manual_seed(i))
            for i in range(STEPS)]


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


@dataclass
class Run:
    losses: list[float]
    params: list[torch.Tensor]
    captures: list[int]  # the capture counter after each step


def _train(dropout: float, set_to_none: bool, step_fn, captures) -> Run:
    """SGD over the same batches from the same seed; ``step_fn(model)`` builds
    ``step(x) -> loss`` (forward and backward); ``captures()`` reads a counter."""
    model = _make_model(dropout)
    step = step_fn(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1234)  # dropout masks
    losses, counts = [], []
    for x in _batches():
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(step(x).item())
        opt.step()
        counts.append(captures())
    return Run(losses, [p.detach().clone() for p in model.parameters()], counts)


def _eager(dropout: float, set_to_none: bool) -> Run:
    def step_fn(model):
        def step(x):
            loss = _loss(model(x))
            loss.backward()
            return loss.detach()
        return step
    return _train(dropout, set_to_none, step_fn, lambda: 0)


def _ours(dropout: float, set_to_none: bool, compiler: str) -> Run:
    torch._dynamo.reset()
    compiled_autograd.reset()

    def step_fn(model):
        compiled = aot_pipeline.compile(model, compiler=compiler, compiled_autograd=True)

        def step(x):
            loss = _loss(compiled(x))
            compiled.backward(loss)
            return loss.detach()
        return step
    run = _train(dropout, set_to_none, step_fn, lambda: compiled_autograd.counters()["captures"])
    assert compiled_autograd.counters()["compiles"] == run.captures[-1]
    assert compiled_autograd.counters()["runs"] == STEPS
    return run


def _torch_own(dropout: float, set_to_none: bool, backend: str) -> Run:
    """torch's own compiled autograd: the flag on when ``torch.compile`` is called."""
    torch._dynamo.reset()

    def step_fn(model):
        def step(x):
            loss = _loss(model(x))
            loss.backward()
            return loss.detach()
        with torch._dynamo.config.patch(compiled_autograd=True):
            return torch.compile(step, backend=backend)
    torch_counters.clear()
    try:
        return _train(dropout, set_to_none, step_fn,
                      lambda: torch_counters["compiled_autograd"]["captures"])
    finally:
        torch._dynamo.reset()


def _assert_like_eager(got: Run, want: Run, **tol) -> None:
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(want.losses), **tol)
    for g, w in zip(got.params, want.params):
        torch.testing.assert_close(g, w, **tol)


def _assert_captures_like_torch(ours: Run, theirs: Run, set_to_none: bool) -> None:
    assert ours.captures == theirs.captures, (ours.captures, theirs.captures)
    # None grads at every step: one capture. Zeroed (existing) grads: step 2 is the first to
    # accumulate into a .grad, a second graph; nothing after that.
    assert ours.captures[-1] == (1 if set_to_none else 2)
    assert ours.captures[1:] == [ours.captures[-1]] * (STEPS - 1)


@pytest.mark.parametrize("dropout,set_to_none", [(0.0, True), (0.25, True), (0.0, False)],
                         ids=["plain", "dropout", "existing-grads"])
def test_nop_ten_steps_capture_like_torch_and_train_like_eager(dropout, set_to_none):
    want = _eager(dropout, set_to_none)
    theirs = _torch_own(dropout, set_to_none, backend="aot_eager")
    ours = _ours(dropout, set_to_none, compiler="nop")
    _assert_captures_like_torch(ours, theirs, set_to_none)
    _assert_like_eager(ours, want, rtol=1e-6, atol=1e-7)
    _assert_like_eager(theirs, want, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_inductor_ten_steps_capture_like_torch_and_train_like_eager():
    # fallback_random: Inductor draws dropout masks like eager, so losses can be compared.
    with torch._inductor.config.patch(fallback_random=True):
        want = _eager(0.25, True)
        theirs = _torch_own(0.25, True, backend="inductor")
        ours = _ours(0.25, True, compiler="inductor")
    _assert_captures_like_torch(ours, theirs, True)
    _assert_like_eager(ours, want, rtol=1e-4, atol=1e-5)


def test_a_changed_backward_recaptures():
    """The kept cache is not reused blindly: a new shape or requires_grad pattern recaptures."""
    torch._dynamo.reset()
    compiled_autograd.reset()
    model = _make_model(0.0)
    compiled = aot_pipeline.compile(model, compiler="nop", compiled_autograd=True)
    reference = _make_model(0.0)

    def step(batch: int) -> int:
        x = torch.randn(batch, 8)
        model.zero_grad(set_to_none=True)
        compiled.backward(_loss(compiled(x)))
        reference.load_state_dict(model.state_dict())
        for p, r in zip(model.parameters(), reference.parameters()):
            r.requires_grad_(p.requires_grad)
        reference.zero_grad(set_to_none=True)
        _loss(reference(x)).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            if r.grad is None:
                assert p.grad is None
            else:
                torch.testing.assert_close(p.grad, r.grad)
        return compiled_autograd.counters()["captures"]

    assert [step(4) for _ in range(3)] == [1, 1, 1]
    # Dynamo recompiles the forward for a new batch size: a new backward node, a new capture.
    assert [step(6) for _ in range(3)] == [2, 2, 2]
    model[0].weight.requires_grad_(False)  # no AccumulateGrad for it: another graph
    assert [step(6) for _ in range(3)] == [3, 3, 3]
    assert model[0].weight.grad is None


def test_two_compiled_models_do_not_share_graphs():
    """Another CompiledModel is another compiler: switching between them recaptures."""
    torch._dynamo.reset()
    compiled_autograd.reset()
    model = _make_model(0.0)
    first = aot_pipeline.compile(model, compiler="nop", compiled_autograd=True)
    second = aot_pipeline.compile(model, compiler="nop", compiled_autograd=True)
    x = torch.randn(4, 8)
    counts = []
    for compiled in (first, first, second, second, first):
        model.zero_grad(set_to_none=True)
        compiled.backward(_loss(compiled(x)))
        counts.append(compiled_autograd.counters()["captures"])
    assert counts == [1, 1, 2, 2, 3]
