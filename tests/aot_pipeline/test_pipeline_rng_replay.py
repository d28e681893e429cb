"""Dropout recomputed at budget 0.0 under Inductor: the forward's draw is replayed.

Inductor turns dropout into its own seeded random (``prims.inductor_seeds``, no tensor
argument), which the replay operators wrap; each runs as an Inductor fallback kernel.
"""

from __future__ import annotations

import pytest
import torch
from zoo import DropoutNet, loss_of


@pytest.mark.slow
@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_inductor_backward_reads_the_forwards_dropout_output(budget):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = DropoutNet(16)
    compiled = torch.compile(module, backend="aot_pipeline", options={"memory_budget": budget})
    x = torch.randn(512, 16)  # a mask bigger than the CPU RNG state: recomputed at 0.0
    torch.manual_seed(3)
    out = compiled(x)
    out.retain_grad()
    loss_of(out).backward()
    # out = fc2(dropped): the grad of fc2's weight is out.grad^T @ dropped, where dropped is
    # what the forward computed (recovered from out); a backward that drew a new mask would
    # recompute another ``dropped``.
    weight, bias = module.fc2.weight.detach(), module.fc2.bias.detach()
    dropped = torch.linalg.solve(weight, (out.detach() - bias).T).T
    torch.testing.assert_close(module.fc2.weight.grad, out.grad.T @ dropped,
                               atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["run_and_save_rng_state", "run_with_rng_state"])
def test_replay_operators_are_kept_out_of_cuda_graphs(name):
    # Inductor matches cudagraph-unsafe ops by name; a captured graph would replay a stale state.
    from aot_partition.fx.passes import rng_ops
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    call = graph.call_function(getattr(rng_ops, name), (x,))
    graph.output((call,))
    found = get_first_incompatible_cudagraph_node(torch.fx.GraphModule({}, graph))
    assert found is call
