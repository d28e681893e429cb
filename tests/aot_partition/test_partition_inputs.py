"""Special joint-graph inputs: forward/backward RNG seed-offsets and BackwardState."""

from __future__ import annotations

import copy

import pytest
import torch
from aot_partition import default_partition, min_cut_rematerialization_partition
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import make_fx

PARTITIONERS = [default_partition, min_cut_rematerialization_partition]


def _joint(primals_1, fwd_seed, fwd_base_offset, tangents_1, bwd_seed, bwd_base_offset):
    y = torch.sin(primals_1) * fwd_seed + fwd_base_offset
    grad = tangents_1 * torch.cos(primals_1) * fwd_seed * bwd_seed + bwd_base_offset
    return [y, grad]


def _inputs():
    torch.manual_seed(0)
    return (torch.randn(4), torch.tensor(2.0), torch.tensor(1.0), torch.randn(4),
            torch.tensor(3.0), torch.tensor(0.5))


def _placeholder_names(module):
    return [n.name for n in module.graph.find_nodes(op="placeholder")]


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_seed_offsets_go_to_their_pass(partition_fn):
    joint = make_fx(_joint, tracing_mode="fake")(*_inputs())
    primal, fwd_seed, fwd_offset, tangent, bwd_seed, bwd_offset = _inputs()
    fw, bw = partition_fn(copy.deepcopy(joint), None, num_fwd_outputs=1)
    assert _placeholder_names(fw) == ["primals_1_1", "fwd_seed_1", "fwd_base_offset_1"]
    assert _placeholder_names(bw)[-3:] == ["tangents_1_1", "bwd_seed_1", "bwd_base_offset_1"]
    y, *saved = fw(primal, fwd_seed, fwd_offset)
    (grad,) = bw(*saved, tangent, bwd_seed, bwd_offset)
    want_y, want_grad = _joint(*_inputs())
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(grad, want_grad)


def _hook(state, grad):
    # Stand-in for a compiled-autograd hook call that reads the backward state.
    return grad * state.scale


@pytest.mark.parametrize("partition_fn", PARTITIONERS)
def test_backward_state_is_passed_straight_to_backward(partition_fn):
    joint = make_fx(_joint, tracing_mode="fake")(*_inputs())
    graph = joint.graph
    last_input = list(graph.find_nodes(op="placeholder"))[-1]
    with graph.inserting_after(last_input):
        state = graph.placeholder("primals_2")
    state.meta["val"] = BackwardState()
    output = next(iter(graph.find_nodes(op="output")))
    grad = output.args[0][1]
    with graph.inserting_before(output):
        hooked = graph.call_function(_hook, (state, grad))
    hooked.meta["val"] = grad.meta["val"]
    output.args = ([output.args[0][0], hooked],)
    joint.recompile()

    fw, bw = partition_fn(joint, None, num_fwd_outputs=1)
    assert _placeholder_names(fw) == ["primals_1_1", "primals_2", "fwd_seed_1",
                                      "fwd_base_offset_1"]
    fw_outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    assert all(getattr(n, "name", None) != "primals_2" for n in fw_outputs)
    assert _placeholder_names(bw)[-1] == "primals_2"
    primal, fwd_seed, fwd_offset, tangent, bwd_seed, bwd_offset = _inputs()
    backward_state = BackwardState()
    backward_state.scale = 10.0
    y, *saved = fw(primal, backward_state, fwd_seed, fwd_offset)
    (got,) = bw(*saved, tangent, bwd_seed, bwd_offset, backward_state)
    torch.testing.assert_close(got, _joint(*_inputs())[1] * 10.0)
