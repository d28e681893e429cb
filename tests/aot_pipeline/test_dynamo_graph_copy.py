"""A copy of the graph Dynamo hands the back end (the split decision compiles copies: the whole
graph kept after comparing, each split) must read to AOTAutograd as Dynamo's: a plain deep copy
drops the parameters' and placeholders' sources, and AOTAutograd then sees no static inputs
(the partitioner prices parameters as if they changed every step, CUDA graphs copy them) and
no argument sources for its duplicate-argument guards."""

from __future__ import annotations

import torch
from aot_pipeline import _compat
from functorch.compile import default_partition, make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified


def _static_inputs_seen(copy_graph):
    """AOTAutograd's static inputs for a Linear's graph as Dynamo hands it, then for
    ``copy_graph`` of it."""
    seen = []

    def partition(joint, inputs, **kwargs):
        seen.append(list(kwargs["static_lifetime_input_indices"]))
        return default_partition(joint, inputs, **kwargs)

    def nop(gm, _inputs):
        return make_boxed_func(gm)

    def backend(gm, example_inputs):
        for graph in (gm, copy_graph(gm)):
            aot_module_simplified(graph, example_inputs, fw_compiler=nop, bw_compiler=nop,
                                  partition_fn=partition)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(torch.nn.Linear(4, 4), backend=backend)(torch.randn(2, 4))
    return seen


def test_a_copied_dynamo_graph_keeps_its_static_inputs():
    original, copied = _static_inputs_seen(_compat.copy_dynamo_graph)
    assert original and copied == original  # the weight and the bias


def test_a_plain_deep_copy_loses_them():
    # The opposite case, what copy_dynamo_graph mends: torch's own deep copy reads as a graph
    # Dynamo did not capture.
    original, copied = _static_inputs_seen(_compat.deepcopy_graph)
    assert original and copied == []
