"""Passes around partitioning (CSE, DCE, backward reordering) and node classification.

Every pass takes a graph and returns whether it changed it; the module is recompiled after.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from aot_partition import classify, min_cut_rematerialization_partition
from aot_partition.fx.classify import FAR_FROM_BACKWARD
from aot_partition.fx.joint import is_tangent
from aot_partition.fx.passes import (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    merge_common_subexpressions,
    reorder_backward,
)
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten


def _count(module, packet):
    return sum(getattr(n.target, "overloadpacket", None) is packet for n in module.graph.nodes)


def _x(*shape):
    return torch.randn(*shape, requires_grad=True)


def test_cse_merges_equal_pure_ops(capture):
    joint = capture(lambda x: x.sin() * x.sin(), _x(4))
    module = joint.fresh()
    assert _count(module, aten.sin) >= 2
    assert eliminate_common_subexpressions(module.graph)
    module.recompile()
    assert _count(module, aten.sin) == 1
    assert not eliminate_common_subexpressions(module.graph)  # nothing left to merge
    x = torch.randn(4)
    tangent = torch.ones(4)
    torch.testing.assert_close(module(x, tangent)[0], joint.module(x, tangent)[0])


def test_cse_keeps_random_ops_and_different_annotations(capture):
    joint = capture(lambda x: torch.nn.functional.dropout(x, 0.5)
                    + torch.nn.functional.dropout(x, 0.5), _x(8))
    module = joint.fresh()
    before = _count(module, aten.native_dropout)
    eliminate_common_subexpressions(module.graph)
    assert before == 2 and _count(module, aten.native_dropout) == 2

    joint = capture(lambda x: x.sin() * x.sin(), _x(4))
    module = joint.fresh()
    first_sin = next(n for n in module.graph.nodes if n.target is aten.sin.default)
    first_sin.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    eliminate_common_subexpressions(module.graph)
    assert _count(module, aten.sin) >= 2


@pytest.mark.parametrize("second,merged", [
    ({"_region_activation_memory_budget": 0.5}, False),  # another region budget: kept apart
    ({"aot_partition_region_memory_budget_bytes": 4096}, False),
    ({"_region_activation_memory_budget": 0.0}, True),   # the same region: merged
])
def test_cse_keeps_ops_of_different_region_budgets_apart(capture, second, merged):
    module = capture(lambda x: x.sin() * x.sin(), _x(4)).fresh()
    first_sin, second_sin = [n for n in module.graph.nodes if n.target is aten.sin.default][:2]
    first_sin.meta["custom"] = {"_region_activation_memory_budget": 0.0}
    second_sin.meta["custom"] = dict(second)
    eliminate_common_subexpressions(module.graph)  # the backward's twin cos ops merge
    assert _count(module, aten.sin) == (1 if merged else 2)


def _structure(graph: fx.Graph) -> list[tuple]:
    """Everything about a graph its generated code depends on, plus who uses whom, in order."""
    def names(value):
        return fx.map_arg(value, lambda n: n.name)
    return [(n.name, n.op, n.target, names(n.args), names(n.kwargs),
             [u.name for u in n.users]) for n in graph.nodes]


def test_merge_isolates_duplicates_and_undo_restores_the_graph(capture):
    module = capture(lambda x: x.sin() * x.sin(), _x(4)).fresh()
    before = _structure(module.graph)
    merged = merge_common_subexpressions(module.graph)
    sins = [n for n in module.graph.nodes if n.target is aten.sin.default]
    assert len(merged.duplicates) >= 1 and sins[1] in merged.duplicates
    for duplicate in merged.duplicates:  # still in the graph, but isolated
        assert not duplicate.users and not duplicate.all_input_nodes
    mul = next(n for n in module.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.args == (sins[0], sins[0])
    merged.undo()
    assert _structure(module.graph) == before
    assert module.graph.python_code("self").src == module.code


def test_partitioning_leaves_the_callers_joint_as_it_was(capture):
    joint = capture(lambda x: x.sin() * x.sin(), _x(4))
    module = joint.fresh()
    code, structure = module.code, _structure(module.graph)
    fw, bw = min_cut_rematerialization_partition(module, joint.inputs,
                                                 num_fwd_outputs=joint.num_fwd_outputs)
    assert _count(fw, aten.sin) == 1  # the partition did see the merged graph
    # torch's partitioner regenerates the joint's code after merging; ours undoes the merge,
    # so the code the module holds still matches its graph.
    assert _structure(module.graph) == structure
    assert module.code == code == module.graph.python_code("self").src
    x, tangent = torch.randn(4), torch.randn(4)
    expected = joint.module(x, tangent)
    for got, want in zip(module(x, tangent), expected):
        torch.testing.assert_close(got, want)


def test_a_failing_partition_still_restores_the_joint(capture, monkeypatch):
    import aot_partition.partitioners as partitioners

    def failing(*args, **kwargs):
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(partitioners, "_choose_saved_values", failing)
    joint = capture(lambda x: x.sin() * x.sin(), _x(4))
    module = joint.fresh()
    structure = _structure(module.graph)
    with pytest.raises(RuntimeError, match="solver exploded"):
        min_cut_rematerialization_partition(module, joint.inputs,
                                            num_fwd_outputs=joint.num_fwd_outputs)
    assert _structure(module.graph) == structure


def test_dce_drops_unused_nodes(capture):
    joint = capture(lambda x: x.sin(), _x(4))
    module = joint.fresh()
    placeholder = next(iter(module.graph.find_nodes(op="placeholder")))
    with module.graph.inserting_after(placeholder):
        module.graph.call_function(aten.cos.default, (placeholder,))
    assert _count(module, aten.cos) == 2  # backward of sin uses cos too
    assert eliminate_dead_code(module.graph)
    module.recompile()
    assert _count(module, aten.cos) == 1
    assert not eliminate_dead_code(module.graph)


def test_reorder_backward_brings_recomputation_next_to_its_use():
    def backward(saved, tangents_1):
        recomputed_a = torch.sin(saved)
        recomputed_b = torch.cos(saved)
        grad = tangents_1 * recomputed_a
        return grad * recomputed_b

    module = fx.symbolic_trace(backward)
    assert reorder_backward(module.graph)
    module.recompile()
    order = [n.name for n in module.graph.nodes if n.op == "call_function"]
    assert order == ["sin", "mul", "cos", "mul_1"]
    saved, tangent = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(module(saved, tangent), backward(saved, tangent))


def test_reorder_backward_takes_a_tuples_outputs_at_once():
    """A recomputed layer norm whose output is read at once and whose statistics only later:
    its getitems move up to right after it, so the tuple (holding the output) dies after the
    output's last use, and memory.py's simulated peak of the backward falls by that output."""
    from aot_partition.memory_models.simulator import simulate_partition

    graph = fx.Graph()
    saved, tangent = graph.placeholder("saved"), graph.placeholder("tangents_1")
    values = {"saved": torch.empty(64, 256), "tangents_1": torch.empty(64, 256)}
    saved.meta["val"], tangent.meta["val"] = values["saved"], values["tangents_1"]

    def call(target, *args):
        node = graph.call_function(target, args)
        node.meta["val"] = target(*[values.get(a.name, a) if isinstance(a, fx.Node) else a
                                    for a in args])
        values[node.name] = node.meta["val"]
        return node

    norm = call(aten.native_layer_norm.default, saved, [256], None, None, 1e-5)
    out = call(operator.getitem, norm, 0)
    grad = call(aten.mul.Tensor, tangent, out)          # the output's last use
    big = call(aten.repeat.default, grad, [2, 1])      # the peak: after the output's use ...
    mean = call(operator.getitem, norm, 1)              # ... before the statistics are read
    rstd = call(operator.getitem, norm, 2)
    stats = call(aten.add.Tensor, mean, rstd)
    total = call(aten.sum.default, big)
    result = call(aten.add.Tensor, stats, total)
    graph.output((result,))
    forward = fx.Graph()  # hands the backward its saved value
    primal = forward.placeholder("primals_1")
    primal.meta["val"] = values["saved"]
    forward.output((primal,))
    before = simulate_partition(forward, graph).peak_bytes
    assert reorder_backward(graph)
    order = [n.name for n in graph.nodes if n.op == "call_function"]
    assert order[:4] == [norm.name, out.name, mean.name, rstd.name]
    # Nothing else moved: the rest keeps its relative order.
    assert order[4:] == [n.name for n in (grad, big, stats, total, result)]
    assert simulate_partition(forward, graph).peak_bytes == before - 64 * 256 * 4


def test_reorder_backward_without_tangent_users_is_identity():
    module = fx.symbolic_trace(lambda saved, tangents_1: torch.sin(saved))
    before = [n.name for n in module.graph.nodes]
    assert not reorder_backward(module.graph)
    assert [n.name for n in module.graph.nodes] == before


def test_classify_zones_order_and_distances(capture):
    joint = capture(lambda x, w: (x @ w).relu(), _x(4, 8), _x(8, 8))
    info = classify(joint.module, joint.num_fwd_outputs)
    by_name = {n.name: n for n in joint.module.graph.nodes}
    mm = next(n for n in by_name.values() if n.target is aten.mm.default)
    relu = next(n for n in by_name.values() if n.target is aten.relu.default)
    tangent = next(n for n in by_name.values() if is_tangent(n))
    primals = [n for n in by_name.values() if n.op == "placeholder" and not is_tangent(n)]
    assert info.inputs == primals
    assert {mm, relu, *primals} <= info.required_fw
    assert tangent in info.required_bw and tangent in info.tangents_closure
    assert not info.required_fw & info.required_bw
    assert info.required_fw_nodes == sorted(info.required_fw, key=info.get_fw_order)
    assert [info.get_fw_order(n) for n in info.required_fw_nodes] == list(
        range(len(info.required_fw)))
    assert info.dist_from_bw[relu] == 1  # its backward user reads it directly
    assert info.dist_from_bw[tangent] == 0
    assert all(info.dist_from_bw[n] < FAR_FROM_BACKWARD for n in (mm, relu))
    assert set(by_name.values()) == info.required_fw | info.required_bw | info.unclaimed
    with pytest.raises(KeyError, match=f"'{tangent.name}' is not a required forward node"):
        info.get_fw_order(tangent)


def test_classify_static_lifetime_inputs(capture):
    joint = capture(lambda x, w: (x @ w).relu(), _x(4, 8), _x(8, 8))
    info = classify(joint.module, joint.num_fwd_outputs, static_lifetime_input_indices=[1])
    assert [n.name for n in info.static_lifetime_inputs] == [info.inputs[1].name]


def test_cse_never_merges_values_that_alias_an_output(capture):
    def viewed_twice(x):
        returned, internal = x.sin(), x.cos()
        return returned.view(-1), returned.view(-1) * 2, internal.view(-1) * internal.view(-1)

    module = capture(viewed_twice, _x(2, 3)).fresh()
    merged = merge_common_subexpressions(module.graph)
    # Both views of `returned` share the returned view's storage: merging them would make
    # the second output alias the first. The views of `internal` merge.
    viewed = [merged.original_inputs[d][0][0].target for d in merged.duplicates
              if d.target is aten.view.default]
    assert aten.cos.default in viewed and aten.sin.default not in viewed
    merged.undo()
    assert module.graph.python_code("self").src == module.code


def test_cse_merges_later_twins_of_a_returned_value_among_themselves(capture):
    module = capture(lambda x: (x.sin(), x.sin() * x.sin()), _x(3)).fresh()
    sins = [n for n in module.graph.nodes if n.target is aten.sin.default]
    merged = merge_common_subexpressions(module.graph)
    # The returned sin stays apart; of the other two, the later merges into the earlier.
    assert len(sins) == 3
    assert [d for d in merged.duplicates if d.target is aten.sin.default] == [sins[2]]
    mul = next(n for n in module.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.args == (sins[1], sins[1])
