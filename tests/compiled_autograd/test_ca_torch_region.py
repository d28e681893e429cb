"""While our compiled graph runs, torch sees a compiled-autograd region, and Dynamo steals the
``inputs`` list: the same Dynamo graph torch's own compiled autograd produces."""

from __future__ import annotations

from typing import Any

import compiled_autograd
import torch
from torch import fx
from torch._dynamo import compiled_autograd as torch_compiled_autograd


def _tiny() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    return model, torch.randn(5, 4)


def test_torch_region_flag_is_up_only_while_our_graph_runs() -> None:
    model, x = _tiny()
    seen: list[bool] = []

    def hook(grad: torch.Tensor) -> torch.Tensor:
        seen.append(torch_compiled_autograd.in_compiled_autograd_region)
        return grad * 2

    model[0].weight.register_hook(hook)
    expected_model, _ = _tiny()
    (expected_model(x) ** 2).sum().backward()
    with compiled_autograd.enable(lambda gm: gm):
        (model(x) ** 2).sum().backward()
    assert seen == [True]
    assert torch_compiled_autograd.in_compiled_autograd_region is False
    torch.testing.assert_close(model[0].weight.grad, 2 * expected_model[0].weight.grad)
    torch.testing.assert_close(model[2].weight.grad, expected_model[2].weight.grad)


def test_dynamo_keeps_inputs_as_one_stolen_list() -> None:
    model, x = _tiny()
    dynamo_placeholders: list[list[tuple[str, bool]]] = []

    def record_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        dynamo_placeholders.append([(n.name, bool(n.meta.get("steal_arg", False)))
                                    for n in gm.graph.find_nodes(op="placeholder")])
        return gm.forward

    def compiler_fn(gm: fx.GraphModule) -> Any:
        assert gm.meta["locals_to_steal"] == ["inputs"]
        return torch.compile(gm, backend=record_backend, fullgraph=True)

    expected_model, _ = _tiny()
    (expected_model(x) ** 2).sum().backward()
    torch._dynamo.reset()
    with compiled_autograd.enable(compiler_fn):
        (model(x) ** 2).sum().backward()
    torch._dynamo.reset()
    assert len(dynamo_placeholders) == 1
    stolen = [name for name, steal in dynamo_placeholders[0] if steal]
    assert [name.lower() for name in stolen] == ["l_inputs_"], dynamo_placeholders[0]
    for got, want in zip(model.parameters(), expected_model.parameters()):
        torch.testing.assert_close(got.grad, want.grad)
