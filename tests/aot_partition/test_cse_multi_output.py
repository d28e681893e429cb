"""CSE of multi-output ops (attention) and of ops random only for some arguments.

torch's own CSE builds a new graph; ours merges in place and undoes the merge afterwards,
so a merged duplicate stays in the joint, detached. Extraction must never copy it: the
attention op is tagged nondeterministic_seeded, which fx's dead-code rule keeps.
"""

from __future__ import annotations

import operator

import aot_partition
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from aot_partition.fx.passes import cse, merge_common_subexpressions
from functorch.compile import aot_function, make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition as torch_min_cut

ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _nop(gm, _inputs):
    return make_boxed_func(gm)


def twice_attention(q):
    return (F.scaled_dot_product_attention(q, q, q)
            + F.scaled_dot_product_attention(q, q, q) * 2)


def both_attentions_returned(q):
    return F.scaled_dot_product_attention(q, q, q), F.scaled_dot_product_attention(q, q, q)


def _query():
    torch.manual_seed(0)
    return torch.randn(1, 2, 8, 16)


def _outputs_and_grad(fn, q):
    q = q.clone().requires_grad_()
    out = fn(q)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    sum(o.pow(2).sum() for o in outs).backward()
    return [o.detach() for o in outs], q.grad


def _forward_graphs(partition_fn):
    graphs = []

    def record(gm, inputs):
        graphs.append(gm.graph)
        return make_boxed_func(gm)

    return graphs, lambda fn: aot_function(fn, fw_compiler=record, bw_compiler=_nop,
                                           partition_fn=partition_fn)


@pytest.mark.parametrize("fn", [twice_attention, both_attentions_returned])
@pytest.mark.parametrize("partition_fn", [aot_partition.min_cut_rematerialization_partition,
                                          torch_min_cut],
                         ids=["ours", "torch"])
def test_merged_attention_matches_eager_standalone(fn, partition_fn):
    q = _query()
    graphs, compile_fn = _forward_graphs(partition_fn)
    outs, grad = _outputs_and_grad(compile_fn(fn), q)
    eager_outs, eager_grad = _outputs_and_grad(fn, q)
    for got, want in zip(outs, eager_outs, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, eager_grad)
    # No call lost its arguments: every attention in the forward reads the query.
    for node in graphs[0].find_nodes(op="call_function", target=ATTENTION):
        assert node.args, graphs[0]


def test_merged_attention_runs_once_in_the_forward():
    graphs, compile_fn = _forward_graphs(aot_partition.min_cut_rematerialization_partition)
    _outputs_and_grad(compile_fn(twice_attention), _query())
    assert len(graphs[0].find_nodes(op="call_function", target=ATTENTION)) == 1


def test_returned_attentions_are_not_merged():
    # Each call's output is returned: merging them would return one tensor twice (an
    # in-place change to one output would show in the other). Eager returns two tensors.
    graphs, compile_fn = _forward_graphs(aot_partition.min_cut_rematerialization_partition)
    q = _query().requires_grad_()
    first, second = compile_fn(both_attentions_returned)(q)
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    assert len(graphs[0].find_nodes(op="call_function", target=ATTENTION)) == 2


@pytest.mark.parametrize("fn", [twice_attention, both_attentions_returned])
def test_merged_attention_matches_eager_through_torch_compile(fn):
    torch._dynamo.reset()
    q = _query()
    compiled = torch.compile(fn, backend="aot_pipeline", options={"compiler": "nop"})
    outs, grad = _outputs_and_grad(compiled, q)
    eager_outs, eager_grad = _outputs_and_grad(fn, q)
    for got, want in zip(outs, eager_outs, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, eager_grad)


def twice_asserted(x):
    y = x.sin()
    torch._assert_async(y.sum() > -1e9, "finite")
    torch._assert_async(y.sum() > -1e9, "finite")
    return y * 2


@pytest.mark.parametrize("partition_fn", [aot_partition.min_cut_rematerialization_partition,
                                          torch_min_cut],
                         ids=["ours", "torch"])
def test_merged_side_effect_is_not_extracted_without_its_arguments(partition_fn):
    # The same path for any op fx keeps as impure: a merged duplicate assert reached the
    # forward as ``_assert_async.msg()`` ("missing value for argument 'self'").
    graphs, compile_fn = _forward_graphs(partition_fn)
    x = torch.randn(4)
    outs, grad = _outputs_and_grad(compile_fn(twice_asserted), x)
    eager_outs, eager_grad = _outputs_and_grad(twice_asserted, x)
    torch.testing.assert_close(outs, eager_outs)
    torch.testing.assert_close(grad, eager_grad)
    asserts = graphs[0].find_nodes(op="call_function", target=torch.ops.aten._assert_async.msg)
    assert asserts and all(node.args for node in asserts)


# ---- a seeded op is random only for some arguments: decided per call, not per op ----------

def _attention_graph(dropout_ps: list[float]) -> tuple[fx.Graph, list[fx.Node]]:
    """One query, then an attention per entry of ``dropout_ps``, every output returned
    summed (so none aliases a graph output)."""
    graph = fx.Graph()
    q = graph.placeholder("q")
    calls, total = [], None
    for p in dropout_ps:
        call = graph.call_function(ATTENTION, (q, q, q, p))
        calls.append(call)
        item = graph.call_function(operator.getitem, (call, 0))
        total = item if total is None else graph.call_function(torch.ops.aten.add.Tensor,
                                                                (total, item))
    graph.output((total,))
    return graph, calls


def _merged_pairs(graph: fx.Graph, calls: list[fx.Node]) -> list[bool]:
    merged = merge_common_subexpressions(graph)
    duplicates = set(merged.duplicates)
    return [calls[i + 1] in duplicates for i in range(0, len(calls), 2)]


@pytest.fixture
def fresh_cse_caches(monkeypatch):
    """CSE's per-op caches as in a new process: the order ops are first seen in matters."""
    monkeypatch.setattr(cse, "_NEVER_MERGED_TARGETS", {})
    monkeypatch.setattr(cse, "_SEEDED_TARGETS", {})


def test_attention_without_dropout_first_then_with_dropout(fresh_cse_caches):
    graph, calls = _attention_graph([0.0, 0.0, 0.5, 0.5])
    assert _merged_pairs(graph, calls) == [True, False]


def test_attention_with_dropout_first_then_without(fresh_cse_caches):
    graph, calls = _attention_graph([0.5, 0.5, 0.0, 0.0])
    assert _merged_pairs(graph, calls) == [False, True]


def test_dropout_p_given_by_keyword_is_read_too(fresh_cse_caches):
    graph = fx.Graph()
    q = graph.placeholder("q")
    calls = [graph.call_function(ATTENTION, (q, q, q), {"dropout_p": p})
             for p in (0.0, 0.0, 0.5, 0.5)]
    graph.output(tuple(graph.call_function(operator.getitem, (c, 0)) for c in calls))
    assert _merged_pairs(graph, calls) == [True, False]


def test_undo_clears_the_duplicate_mark():
    graph, calls = _attention_graph([0.0, 0.0])
    merged = merge_common_subexpressions(graph)
    assert merged.duplicates[0] is calls[1]
    assert calls[1].meta["cse_merged_duplicate_of"] is calls[0]
    merged.undo()
    assert "cse_merged_duplicate_of" not in calls[1].meta
    assert calls[1].args == calls[0].args
