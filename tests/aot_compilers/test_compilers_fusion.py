"""memory_efficient_fusion: our min-cut partitioner, default decompositions, TorchScript."""

from __future__ import annotations

import pytest
import torch
from aot_compilers import default_decompositions, memory_efficient_fusion, nop
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import min_cut_rematerialization_partition as torch_min_cut
from zoo import assert_matches_eager, make_case

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def chain(x, w):
    h = torch.nn.functional.gelu(x @ w)
    return (h.sin() * h.cos()).sum(-1)


def saved_bytes_compiler(record):
    """A backward compiler recording the bytes saved for backward (non-tangent inputs)."""
    def compiler(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "placeholder" and not node.name.startswith("tangents"):
                val = node.meta["val"]
                record.append(val.numel() * val.element_size())
        return nop(gm, example_inputs)
    return compiler


def run(fn, *inputs):
    out = fn(*inputs)
    out.sum().backward()
    return out


def test_module_with_default_ts_compilers_matches_eager():
    assert_matches_eager(make_case("mlp"), memory_efficient_fusion)


def test_saves_what_torch_min_cut_saves():
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    ours: list[int] = []
    theirs: list[int] = []
    run(memory_efficient_fusion(chain, fw_compiler=nop, bw_compiler=saved_bytes_compiler(ours)),
        x, w)
    run(aot_function(chain, fw_compiler=nop, bw_compiler=saved_bytes_compiler(theirs),
                     partition_fn=torch_min_cut, decompositions=default_decompositions), x, w)
    assert ours and sorted(ours) == sorted(theirs)


def test_default_decompositions_remove_activation_backwards():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm.code)
        return nop(gm, example_inputs)

    x, w = torch.randn(4, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    out = run(memory_efficient_fusion(chain, fw_compiler=nop, bw_compiler=capture), x, w)
    torch.testing.assert_close(out, chain(x, w))
    assert graphs and "gelu_backward" not in graphs[0] and "erf" in graphs[0]
    assert torch.ops.aten.gelu_backward.default in default_decompositions
    assert torch.ops.aten.detach.default in default_decompositions


def test_function_with_ts_compile_gradients_match_eager():
    x, w = torch.randn(4, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    out = memory_efficient_fusion(chain)(x, w)
    ref = chain(x, w)
    torch.testing.assert_close(out, ref)
    got = torch.autograd.grad(out.sum(), (x, w))
    want = torch.autograd.grad(ref.sum(), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


def test_unknown_override_is_named_with_valid_ones():
    with pytest.raises(TypeError, match=r"unknown override\(s\) \['fw_compilr'\]; valid: .*"
                                        r"'fw_compiler'"):
        memory_efficient_fusion(chain, fw_compilr=nop)


def test_non_callable_is_refused():
    with pytest.raises(TypeError, match=r"expects a function or nn\.Module, got int"):
        memory_efficient_fusion(3)
