"""A joint whose tangent placeholders were replaced by constants (``aten.ones``) is partitioned
as torch's partitioner partitions it (issue 52, item 4): the gradients are what the backward
needs, so torch saves them (computed in the forward) or recomputes them, and so do we."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
from aot_config import functorch as our_flags
from aot_partition import explain_partition, min_cut_rematerialization_partition
from aot_partition.core import CoreGraph, CoreNode, partition
from torch._functorch import config as torch_flags
from torch._functorch import partitioners as torch_partitioners


def _constant_tangents(joint: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``joint`` with every tangent placeholder replaced by ``aten.ones`` of its
    shape (as a front end that folds the gradient seed does)."""
    module = copy.deepcopy(joint)
    graph = module.graph
    for node in list(graph.nodes):
        if node.op == "placeholder" and "tangents" in str(node.target):
            val = node.meta["val"]
            with graph.inserting_before(node):
                ones = graph.call_function(torch.ops.aten.ones.default, (list(val.shape),),
                                           {"dtype": val.dtype, "device": val.device})
            ones.meta["val"] = val
            node.replace_all_uses_with(ones)
            graph.erase_node(node)
    graph.lint()
    module.recompile()
    return module


CASES = {
    "relu_sin_sum": (lambda x, w: (torch.relu(x @ w).sin() * 2).sum(), ((8, 16), (16, 16))),
    "gelu_mlp": (lambda x, w1, w2: torch.nn.functional.gelu(x @ w1).tanh() @ w2,
                 ((8, 16), (16, 32), (32, 4))),
    "layer_norm_mean": (lambda x, w: torch.nn.functional.layer_norm(x @ w, (16,)).exp().mean(),
                        ((8, 16), (16, 16))),
}


def _saved_names(fw: fx.GraphModule, num_fwd_outputs: int) -> list[str]:
    outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    return sorted(node.name for node in outputs[num_fwd_outputs:])


def _assert_matches_eager(fn, inputs, fw: fx.GraphModule, bw: fx.GraphModule,
                          num_fwd_outputs: int) -> None:
    """fw then bw on real inputs give eager's outputs and its gradients for a seed of ones."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    expected = fn(*leaves)
    expected_grads = torch.autograd.grad(expected, leaves, torch.ones_like(expected))
    with torch.no_grad():
        fw_outputs = fw(*(t.detach() for t in inputs))
        grads = bw(*fw_outputs[num_fwd_outputs:])
    torch.testing.assert_close(fw_outputs[0], expected)
    assert len(grads) == len(expected_grads)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("budget", [1.0, 0.5])
@pytest.mark.parametrize("name", sorted(CASES))
def test_constant_tangents_are_partitioned_as_torch_does(name, budget, capture):
    fn, shapes = CASES[name]
    inputs = [torch.randn(*shape, requires_grad=True) for shape in shapes]
    joint = capture(fn, *inputs)
    constant = _constant_tangents(joint.module)
    n = joint.num_fwd_outputs
    assert not any("tangents" in str(p.target) for p in constant.graph.find_nodes(op="placeholder"))
    with torch_flags.patch(activation_memory_budget=budget):
        torch_fw, torch_bw = torch_partitioners.min_cut_rematerialization_partition(
            copy.deepcopy(constant), None, num_fwd_outputs=n)
    with our_flags.patch(activation_memory_budget=budget):
        fw, bw = min_cut_rematerialization_partition(copy.deepcopy(constant), None,
                                                     num_fwd_outputs=n)
    assert _saved_names(fw, n) == _saved_names(torch_fw, n)
    _assert_matches_eager(fn, inputs, torch_fw, torch_bw, n)  # the comparison itself is sound
    _assert_matches_eager(fn, inputs, fw, bw, n)


def test_budget_zero_saves_the_inputs_as_torch_does(capture):
    """Runtime-optimal saves the two gradients, which weigh what the inputs weigh (1,536
    bytes each way): torch's budget 0 saves the inputs, and a tie goes to them here too."""
    fn, shapes = CASES["relu_sin_sum"]
    inputs = [torch.randn(*shape, requires_grad=True) for shape in shapes]
    joint = capture(fn, *inputs)
    constant = _constant_tangents(joint.module)
    n = joint.num_fwd_outputs
    with torch_flags.patch(activation_memory_budget=0.0):
        torch_fw, _ = torch_partitioners.min_cut_rematerialization_partition(
            copy.deepcopy(constant), None, num_fwd_outputs=n)
    with our_flags.patch(activation_memory_budget=0.0):
        fw, bw = min_cut_rematerialization_partition(copy.deepcopy(constant), None,
                                                     num_fwd_outputs=n)
    assert _saved_names(fw, n) == _saved_names(torch_fw, n) == ["primals_1", "primals_2"]
    _assert_matches_eager(fn, inputs, fw, bw, n)


def test_a_zero_byte_cap_recomputes_the_gradients_from_the_inputs(capture):
    """The byte cap's candidates price the knapsack items though the fraction has no range to
    trade (runtime-optimal weighs what the inputs do): 0 bytes saves the inputs alone."""
    fn, shapes = CASES["gelu_mlp"]
    inputs = [torch.randn(*shape, requires_grad=True) for shape in shapes]
    joint = capture(fn, *inputs)
    constant = _constant_tangents(joint.module)
    n = joint.num_fwd_outputs
    with our_flags.patch(activation_memory_budget_bytes=0):
        report = explain_partition(copy.deepcopy(constant), None, num_fwd_outputs=n)
        fw, bw = min_cut_rematerialization_partition(copy.deepcopy(constant), None,
                                                     num_fwd_outputs=n)
    assert report.saved_bytes == 0
    assert _saved_names(fw, n) == ["primals_1", "primals_2", "primals_3"]
    _assert_matches_eager(fn, inputs, fw, bw, n)


def test_the_core_splits_a_backward_known_only_by_what_it_needs():
    """No tangent, nothing in_backward, but a value the backward needs that the forward does not
    compute (``backward=True``, ``forward=False``): the core cuts, as torch does. A whole step
    with every gradient ``forward`` stays refused (test_core_no_silent_answers.py)."""
    graph = CoreGraph((
        CoreNode("x", nbytes=64, category="input", forward=True),
        CoreNode("w", nbytes=256, category="parameter", forward=True),
        CoreNode("mm", ("x", "w"), nbytes=64, category="compute", forward=True),
        CoreNode("relu", ("mm",), nbytes=64, category="pointwise", forward=True),
        CoreNode("out", ("relu",), nbytes=4, category="reduction", forward=True, output=True),
        CoreNode("seed", nbytes=4, category="other", trivial=True),  # aten.ones: a constant
        CoreNode("g_relu", ("seed", "relu"), nbytes=64, category="pointwise"),
        CoreNode("g_w", ("x", "g_relu"), nbytes=256, category="compute", backward=True),
        CoreNode("g_x", ("g_relu", "w"), nbytes=64, category="compute", backward=True),
    ))
    recompute_all = partition(graph)
    assert recompute_all.saved == ("x", "w")
    assert {k: d.kind for k, d in recompute_all.decisions.items()} == {
        "x": "saved", "w": "saved", "mm": "recomputed", "relu": "recomputed", "out": "forward",
        "seed": "backward", "g_relu": "backward", "g_w": "backward", "g_x": "backward"}
    # With the matmul banned, g_relu (64 bytes, read by both gradients) is the cheapest cut:
    # computed in the forward and saved, as torch saves a constant-seeded gradient term.
    matmul_banned = partition(graph, bans={"mm": "my compiler never recomputes a matmul"})
    assert matmul_banned.saved == ("x", "w", "g_relu")
    assert matmul_banned.decisions["g_w"].kind == matmul_banned.decisions["g_x"].kind == \
        "backward"
