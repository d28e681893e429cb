"""Tensor, post-accumulate-grad and module hooks run in eager's order with eager's values."""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from torch import nn


def _hooked_model(events: list) -> tuple[nn.Module, torch.Tensor]:
    """An MLP with every kind of hook; each records (name, detached value) into ``events``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    first, last = model[0], model[2]

    def record(name):
        def hook(*args):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            nested = [t for a in args if isinstance(a, tuple) for t in a
                      if isinstance(t, torch.Tensor)]
            events.append((name, [t.detach().clone() for t in tensors + nested]))
        return hook

    def double(grad):
        events.append(("weight0.double", [grad.detach().clone()]))
        return grad * 2

    first.weight.register_hook(double)
    last.bias.register_hook(record("bias2.tensor_hook"))
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(record(f"{name}.post_acc"))
    last.register_full_backward_pre_hook(record("last.module_pre"))
    last.register_full_backward_hook(record("last.module_post"))
    first.register_full_backward_hook(record("first.module_post"))
    x = torch.randn(4, 6, requires_grad=True)
    return model, x


def _run(compiled: bool) -> tuple[list, dict]:
    events: list = []
    model, x = _hooked_model(events)
    recorder_graphs: list = []

    def compiler_fn(gm):
        recorder_graphs.append(gm)
        return gm

    context = compiled_autograd.enable(compiler_fn) if compiled else torch.enable_grad()
    with context:
        model(x).pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grads["x"] = x.grad.clone()
    if compiled:
        assert len(recorder_graphs) == 1
    return events, grads


def test_hooks_run_in_eager_order_with_eager_values():
    want_events, want_grads = _run(compiled=False)
    got_events, got_grads = _run(compiled=True)
    assert [name for name, _ in got_events] == [name for name, _ in want_events]
    for (name, got), (_, want) in zip(got_events, want_events):
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, msg=lambda m, name=name: f"{name}: {m}")
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name])


def test_tensor_hook_changes_the_gradient():
    _, grads = _run(compiled=True)
    events: list = []
    model, x = _hooked_model(events)
    model(x).pow(2).sum().backward()
    # the hook doubled weight0's gradient in both runs; a skipped hook would halve it here
    torch.testing.assert_close(grads["0.weight"], model[0].weight.grad)
    plain = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    plain.load_state_dict(model.state_dict())
    plain(x).pow(2).sum().backward()
    torch.testing.assert_close(grads["0.weight"], 2 * plain[0].weight.grad)


def test_hook_nodes_are_in_the_graph():
    events: list = []
    model, x = _hooked_model(events)
    graphs: list = []
    with compiled_autograd.enable(lambda gm: graphs.append(gm) or gm):
        model(x).sum().backward()
    hook_types = [n.kwargs.get("hook_type") for n in graphs[0].graph.nodes
                  if n.op == "call_function" and n.kwargs.get("hook_type")]
    assert hook_types.count("post_acc_grad_hook") == 4
    assert hook_types.count("tensor_pre_hook") == 2
    # hooks ran once each, on real tensors: capture itself never calls them
    assert len(events) == 9
    assert all(not isinstance(t, torch._subclasses.FakeTensor) for _, ts in events for t in ts)


def test_post_accumulate_grad_hook_returning_a_value_is_an_error():
    p = nn.Parameter(torch.ones(3))
    p.register_post_accumulate_grad_hook(lambda param: param * 2)
    with pytest.raises(RuntimeError, match="post-accumulate-grad hook .* must return None"):
        with compiled_autograd.enable(lambda gm: gm):
            (p * 2).sum().backward()


def _node_hooks_run(compiled: bool) -> tuple[list, torch.Tensor]:
    events: list = []
    torch.manual_seed(0)
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    y = torch.tanh(x @ w)

    def pre(grad_outputs):
        events.append(("pre", grad_outputs[0].detach().clone()))
        return (grad_outputs[0] * 3,)

    def post(grad_inputs, grad_outputs):
        events.append(("post", grad_inputs[0].detach().clone()))

    y.grad_fn.register_prehook(pre)
    y.grad_fn.register_hook(post)
    context = compiled_autograd.enable(lambda gm: gm) if compiled else torch.enable_grad()
    with context:
        y.sum().backward()
    return events, w.grad


def test_node_pre_and_post_hooks_match_eager():
    want_events, want_grad = _node_hooks_run(compiled=False)
    got_events, got_grad = _node_hooks_run(compiled=True)
    assert [n for n, _ in got_events] == [n for n, _ in want_events] == ["pre", "post"]
    for (_, got), (_, want) in zip(got_events, want_events):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
