"""debug_nop: real values are checked, node by node, against meta["val"]."""

from __future__ import annotations

import pytest
import torch
from aot_compilers import DebugInterpreter, GraphMismatchError, debug_nop
from torch.fx.experimental.proxy_tensor import make_fx


def f(x, w):
    y = x @ w
    return torch.relu(y).t(), y.sum(0)


def traced(mode: str = "fake"):
    return make_fx(f, tracing_mode=mode)(torch.randn(4, 6), torch.randn(6, 5))


def node_named(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def test_passes_and_checks_every_tensor_on_a_correct_graph():
    gm = traced()
    interp = DebugInterpreter(gm)
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    out = interp.run(x, w)
    torch.testing.assert_close(out[0], torch.relu(x @ w).t())
    # 2 placeholders + mm, relu, t, sum: every node with meta["val"] was compared.
    assert interp.checked_values >= 6


def test_symbolic_sizes_bind_to_real_sizes():
    gm = traced("symbolic")
    run = debug_nop(gm, [])
    x, w = torch.randn(3, 7), torch.randn(7, 2)  # other sizes than traced
    out = run([x, w])
    torch.testing.assert_close(out[1], (x @ w).sum(0))


def test_symbolic_size_mismatch_names_node_and_binding():
    gm = traced("symbolic")
    mm = node_named(gm, torch.ops.aten.mm.default)
    val = mm.meta["val"]
    mm.meta["val"] = val.new_empty((val.shape[0] * 2, val.shape[1]))  # claims 2*s0 rows
    with pytest.raises(GraphMismatchError,
                       match=r"node 'mm' \(aten\.mm\.default\) output 0: size mismatch: "
                             r"recorded \(2\*s\d+, s\d+\) aka \(6, 2\) .*real value has \(3, 2\)"):
        debug_nop(gm, [])([torch.randn(3, 7), torch.randn(7, 2)])


def test_wrong_stride_is_caught_naming_the_node_and_both_values():
    gm = traced()
    relu = node_named(gm, torch.ops.aten.relu.default)
    val = relu.meta["val"]
    relu.meta["val"] = val.t().contiguous().t()  # same size, column-major strides (1, 4)
    with pytest.raises(GraphMismatchError,
                       match=r"node 'relu' \(aten\.relu\.default\) output 0: stride mismatch: "
                             r"recorded \(1, 4\) in meta\['val'\] but real value has \(5, 1\)"):
        debug_nop(gm, [])([torch.randn(4, 6), torch.randn(6, 5)])


def test_wrong_dtype_is_caught_naming_the_node_and_both_values():
    gm = traced()
    summed = node_named(gm, torch.ops.aten.sum.dim_IntList)
    summed.meta["val"] = summed.meta["val"].to(torch.float64)
    with pytest.raises(GraphMismatchError,
                       match=r"node 'sum_1' \(aten\.sum\.dim_IntList\) output 0: dtype mismatch: "
                             r"recorded torch\.float64 .* real value has torch\.float32"):
        debug_nop(gm, [])([torch.randn(4, 6), torch.randn(6, 5)])


def test_strides_of_size_one_dimensions_are_not_significant():
    def g(x):
        return x.unsqueeze(1) * 2

    gm = make_fx(g, tracing_mode="fake")(torch.randn(4))
    node = node_named(gm, torch.ops.aten.mul.Tensor)
    val = node.meta["val"]
    node.meta["val"] = val.as_strided(val.shape, (1, 99))  # dim 1 has size 1: stride irrelevant
    debug_nop(gm, [])([torch.randn(4)])


def test_wrong_input_metadata_is_caught_on_the_placeholder():
    gm = traced()
    with pytest.raises(GraphMismatchError, match=r"node 'x_1' \(placeholder x_1\).*dtype"):
        debug_nop(gm, [])([torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 5)])
