"""A torch.compile'd forward: its AOTAutograd backward is pasted into the one captured graph."""

from __future__ import annotations

import compiled_autograd
import pytest
import torch
from compiled_autograd.graph_ops import call_backward
from zoo import make_case


def _compiled(module):
    compiled = torch.compile(module, backend="aot_eager")
    return lambda *args: compiled(*args)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_compiled_forward_backward_matches_eager(name, compare_backward, recorder):
    compare_backward(make_case(name), recorder, forward=_compiled)
    assert len(recorder.graphs) == 1
    graph = recorder.graphs[0].graph
    pasted = [n for n in graph.nodes if n.name.startswith("aot")]
    assert pasted, "the AOT backward must be pasted node by node, not called"
    assert call_backward not in [n.target for n in graph.nodes]
    aten_ops = [n for n in pasted if isinstance(n.target, torch._ops.OpOverload)]
    assert any(n.target is torch.ops.aten.mm.default for n in aten_ops)


def test_accumulate_grad_is_moved_up_next_to_its_gradient(recorder):
    case = make_case("mlp")
    x = case.inputs[0]
    step = _compiled(case.module)
    with compiled_autograd.enable(recorder):
        step(x).pow(2).sum().backward()
    nodes = list(recorder.graphs[0].graph.nodes)
    from compiled_autograd.graph_ops import call_accumulate_grad

    positions = [i for i, n in enumerate(nodes) if n.target is call_accumulate_grad]
    last_aten = max(i for i, n in enumerate(nodes) if isinstance(n.target, torch._ops.OpOverload))
    # eager order: some parameter gradients are accumulated before the backward finishes
    assert min(positions) < last_aten
