"""The clean-up passes on small hand-built graphs, and CPU scalars on CUDA graphs."""

from __future__ import annotations

import operator

import compiled_autograd
import pytest
import torch
from compiled_autograd import passes
from compiled_autograd.graph_ops import (
    call_accumulate_grad,
    call_hook,
    unwrap_maybe_dynamic_int,
)
from torch import fx
from torch._subclasses import FakeTensorMode


def _graph_with_placeholders() -> tuple[fx.Graph, dict[str, fx.Node]]:
    graph = fx.Graph()
    return graph, {name: graph.placeholder(name) for name in passes.PLACEHOLDERS}


def test_dce_keeps_hooks_and_accumulate_grad_and_drops_dead_math():
    graph, ph = _graph_with_placeholders()
    x = graph.call_function(operator.getitem, (ph["inputs"], 0))
    dead = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    hook = graph.call_function(operator.getitem, (ph["hooks"], 0))
    graph.call_function(call_hook, (hook, x), {"hook_type": "post_acc_grad_hook"})
    graph.call_function(call_accumulate_grad, (x, None, x, False))
    graph.output([])
    removed = passes.eliminate_dead_code(graph)
    assert removed == 1
    assert dead not in graph.nodes
    assert x in graph.nodes and hook in graph.nodes


def test_remove_unused_sizes_renumbers_the_used_ones():
    graph, ph = _graph_with_placeholders()
    unwrapped = []
    for i in range(3):
        item = graph.call_function(operator.getitem, (ph["sizes"], i))
        unwrapped.append(graph.call_function(unwrap_maybe_dynamic_int, (item,)))
    x = graph.call_function(operator.getitem, (ph["inputs"], 0))
    view = graph.call_function(torch.ops.aten.view.default, (x, [unwrapped[2]]))
    graph.output([view])
    assert passes.remove_unused_sizes(graph) == [2]
    reads = [n for n in ph["sizes"].users]
    assert [n.args[1] for n in reads] == [0]


def test_accumulate_grad_moves_right_after_its_gradient():
    graph, ph = _graph_with_placeholders()
    param = graph.call_function(operator.getitem, (ph["inputs"], 0))
    grad = graph.call_function(torch.ops.aten.mul.Tensor, (param, 2))
    other = graph.call_function(torch.ops.aten.add.Tensor, (grad, 1))
    acc = graph.call_function(call_accumulate_grad, (param, None, grad, False))
    graph.output([other])
    passes.reorder_accumulate_grad(graph)
    order = list(graph.nodes)
    assert order.index(acc) == order.index(grad) + 1 < order.index(other)


def _scalar_graph(device: str) -> tuple[fx.Graph, fx.Node]:
    graph, ph = _graph_with_placeholders()
    with FakeTensorMode():
        big = torch.empty(4, device=device)
        scalar = torch.empty((), device="cpu")
    x = graph.call_function(operator.getitem, (ph["inputs"], 0))
    x.meta["val"] = big
    s = graph.call_function(operator.getitem, (ph["inputs"], 1))
    s.meta["val"] = scalar
    graph.output([graph.call_function(torch.ops.aten.div.Tensor, (x, s))])
    return graph, s


def test_cpu_scalar_inputs_move_only_when_the_graph_has_cuda_inputs():
    graph, scalar = _scalar_graph("cuda")
    assert passes.move_cpu_scalars_to_cuda(graph) == [1]
    graph, scalar = _scalar_graph("cpu")
    assert passes.move_cpu_scalars_to_cuda(graph) == []
    assert scalar.meta["val"].device.type == "cpu"


def test_cpu_scalar_seen_by_user_code_stays_on_cpu():
    graph, ph = _graph_with_placeholders()
    with FakeTensorMode():
        big, scalar = torch.empty(4, device="cuda"), torch.empty(())
    x = graph.call_function(operator.getitem, (ph["inputs"], 0))
    x.meta["val"] = big
    s = graph.call_function(operator.getitem, (ph["inputs"], 1))
    s.meta["val"] = scalar
    hook = graph.call_function(operator.getitem, (ph["hooks"], 0))
    graph.call_function(call_hook, (hook, s), {"hook_type": "tensor_pre_hook"})
    graph.output([])
    assert passes.move_cpu_scalars_to_cuda(graph) == []


@pytest.mark.cuda
def test_cuda_backward_with_cpu_scalars_moved_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 1)).cuda()
    x = torch.randn(5, 8, device="cuda")
    want = torch.autograd.grad((model(x) / 3.0).sum(), list(model.parameters()))
    graphs = []
    with compiled_autograd.enable(lambda gm: graphs.append(gm) or gm,
                                  move_cpu_scalars_to_cuda=True):
        (model(x) / 3.0).sum().backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w)
    assert len(graphs) == 1


@pytest.mark.cuda
def test_cuda_inductor_backward_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(),
                                torch.nn.Linear(8, 1)).cuda()
    x = torch.randn(5, 8, device="cuda")
    want = torch.autograd.grad(model(x).pow(2).sum(), list(model.parameters()))
    with compiled_autograd.enable(compiled_autograd.inductor_compiler):
        for _ in range(2):
            model.zero_grad()
            model(x).pow(2).sum().backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w)
    assert compiled_autograd.counters()["captures"] == 1
