"""Each ban heuristic, its flag, and the flags that switch groups of them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import MinCutOptions, classify, default_op_types, explain_partition
from aot_partition.fx import policy as P
from aot_partition.fx.classify import FAR_FROM_BACKWARD
from aot_partition.partitioners import min_cut_rematerialization_partition
from torch.utils.checkpoint import CheckpointPolicy
from zoo import assert_matches_eager, make_case

aten = torch.ops.aten
ALL_ON = MinCutOptions(True, True, True, True, True)


def _context(joint, options=ALL_ON, max_dist_from_bw=1000, recompute_views=False):
    info = classify(joint.module, joint.num_fwd_outputs)
    return P.PolicyContext(default_op_types(), info, options, recompute_views, max_dist_from_bw)


def _rule_names(options):
    return [name for name, _ in P.active_ban_rules(options)]


def _node(joint, packet, index=0):
    return [n for n in joint.module.graph.nodes
            if getattr(n.target, "overloadpacket", None) is packet][index]


def _x(*shape):
    return torch.randn(*shape, requires_grad=True)


def test_reduction_is_banned_with_its_ratio(capture):
    joint = capture(lambda x: (x.sum(-1, keepdim=True) * x).sin(), _x(4, 16))
    total = _node(joint, aten.sum)
    assert P.reduction(total, _context(joint)) == "reduction: output 16x smaller than inputs"
    off = replace(ALL_ON, ban_if_reduction=False)
    assert "reduction" in _rule_names(ALL_ON) and "reduction" not in _rule_names(off)
    assert P.ban_reason(total, _context(joint)) == "reduction: output 16x smaller than inputs"
    assert P.ban_reason(total, _context(joint, off)) is None
    assert P.reduction(_node(joint, aten.mul), _context(joint)) is None


def test_allowlist_then_op_categories(capture):
    joint = capture(lambda x, w: torch.nn.functional.dropout(x @ w, 0.5).sin(),
                    _x(4, 8), _x(8, 8))
    mm, dropout = _node(joint, aten.mm), _node(joint, aten.native_dropout)
    ctx = _context(joint)
    assert P.not_in_allowlist(mm, ctx) == "not in allowlist: aten.mm is not a recomputable op"
    assert P.ban_reason(dropout, ctx).startswith("not in allowlist: aten.native_dropout")
    relaxed = _context(joint, replace(ALL_ON, ban_if_not_in_allowlist=False))
    assert P.ban_reason(mm, relaxed) == "compute-intensive op: aten.mm"
    assert P.ban_reason(dropout, relaxed).startswith("random op")
    # The two category rules stand in for the allowlist: consulted only without it.
    assert "not_in_allowlist" not in _rule_names(relaxed.options)
    assert not {"random_op", "compute_intensive"} & set(_rule_names(ALL_ON))
    assert {"random_op", "compute_intensive"} <= set(_rule_names(relaxed.options))


def test_materialized_in_backward(capture):
    mlp = make_case("mlp")
    joint = capture(mlp.module, *(t.clone().requires_grad_() for t in mlp.inputs))
    gelu = _node(joint, aten.gelu)
    reason = P.materialized_in_backward(gelu, _context(joint))
    assert reason is not None and reason.startswith("materialized in backward: used unfused by mm")
    off = replace(ALL_ON, ban_if_materialized_backward=False)
    assert "materialized_in_backward" not in _rule_names(off)
    assert P.ban_reason(gelu, _context(joint, off)) is None
    # sin's only backward users are pointwise: fusible, so not materialized.
    pointwise = capture(lambda x: x.sin().cos(), _x(4, 4))
    assert P.materialized_in_backward(_node(pointwise, aten.sin), _context(pointwise)) is None


def test_max_dist_from_bw(capture):
    joint = capture(lambda x: x.sin().cos().exp().tanh(), _x(4, 4))
    sin = _node(joint, aten.sin)
    info_dist = _context(joint).node_info.dist_from_bw[sin]
    assert info_dist >= 1
    assert P.too_far_from_backward(sin, _context(joint, max_dist_from_bw=0)) == (
        f"too far from backward: {info_dist} ops > max_dist_from_bw=0")
    assert P.too_far_from_backward(sin, _context(joint)) is None


def _chain(length):
    """x + 1 repeated: add i is ``length - i`` hops from the backward (only the last add is
    read by it, through sin's derivative)."""
    def fn(x):
        for _ in range(length):
            x = x + 1.0
        return x.sin()
    return fn


def _far_reasons(report):
    return {name: why for name, why in report.banned.items()
            if why.startswith("too far from backward")}


def test_too_far_from_backward_fires_beyond_max_dist_from_bw(capture):
    joint = capture(_chain(30), _x(4))
    adds = [n for n in joint.module.graph.nodes if n.target is aten.add.Tensor]
    ctx = _context(joint, max_dist_from_bw=10)
    dist = ctx.node_info.dist_from_bw
    assert [dist[n] for n in adds] == list(range(30, 0, -1))
    far = [n for n in adds if dist[n] > 10]
    for node in far:
        assert P.too_far_from_backward(node, ctx) == (
            f"too far from backward: {dist[node]} ops > max_dist_from_bw=10")
        assert P.ban_reason(node, ctx) == P.too_far_from_backward(node, ctx)
    assert P.too_far_from_backward(adds[-10], ctx) is None  # exactly 10 hops: allowed
    # Through the flag, as the partitioner reads it.
    with functorch_config.patch(max_dist_from_bw=10):
        report = explain_partition(joint.module, joint.inputs,
                                   num_fwd_outputs=joint.num_fwd_outputs)
    assert _far_reasons(report) == {n.name: P.too_far_from_backward(n, ctx) for n in far}
    # torch's check (`max_dist_from_bw < dist < 1000`) can never fire from 999 up; here the
    # flag means what it says at any value.
    far_info = replace(ctx.node_info, dist_from_bw={**dist, adds[0]: 5000})
    for limit in (1000, 2000):
        far_ctx = P.PolicyContext(default_op_types(), far_info, ALL_ON, False, limit)
        assert P.too_far_from_backward(adds[0], far_ctx) == (
            f"too far from backward: 5000 ops > max_dist_from_bw={limit}")


def test_too_far_from_backward_spares_close_nodes_and_the_default(capture):
    joint = capture(_chain(30), _x(4))
    adds = [n for n in joint.module.graph.nodes if n.target is aten.add.Tensor]
    sin = _node(joint, aten.sin)
    # The default (1000 hops) bans nothing in a graph where every node is closer.
    ctx = _context(joint)
    assert ctx.max_dist_from_bw == P.PolicyContext.create(
        default_op_types(), ctx.node_info, ALL_ON).max_dist_from_bw == 1000
    assert all(P.too_far_from_backward(n, ctx) is None for n in joint.module.graph.nodes)
    report = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert _far_reasons(report) == {}
    # A close node is spared under a tight limit.
    assert P.too_far_from_backward(adds[-1], _context(joint, max_dist_from_bw=1)) is None
    # A node that never reaches the backward is never "too far": nothing would recompute it.
    assert ctx.node_info.dist_from_bw[sin] == FAR_FROM_BACKWARD
    assert P.too_far_from_backward(sin, _context(joint, max_dist_from_bw=0)) is None


def test_annotations_and_exemptions(capture):
    joint = capture(lambda x: x.sin().cos(), _x(4, 4))
    sin = _node(joint, aten.sin)
    ctx = _context(joint)
    assert P.ban_reason(sin, ctx) is None
    sin.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    assert P.ban_reason(sin, ctx) == "MUST_SAVE annotation"
    sin.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    assert not P.can_be_banned(sin, ctx, set())
    del sin.meta["recompute"]
    assert P.can_be_banned(sin, ctx, set()) and not P.can_be_banned(sin, ctx, {sin})


def test_options_from_flags_and_aggressive_recomputation():
    assert MinCutOptions.from_flags() == ALL_ON
    with functorch_config.patch(ban_recompute_reductions=False):
        assert MinCutOptions.from_flags() == replace(ALL_ON, ban_if_reduction=False)
    with functorch_config.patch(aggressive_recomputation=True):
        assert MinCutOptions.from_flags() == MinCutOptions(False, False, False, False, True)


def test_recompute_views_never_saves_views(capture, aot_with):
    case = make_case("views")
    joint = capture(case.module, *(t.clone().requires_grad_() for t in case.inputs))
    ops = default_op_types()
    with functorch_config.patch(recompute_views=True):
        fw, _ = min_cut_rematerialization_partition(joint.fresh(), joint.inputs,
                                                    num_fwd_outputs=joint.num_fwd_outputs)
        assert_matches_eager(case, aot_with(min_cut_rematerialization_partition))
    saved = next(iter(fw.graph.find_nodes(op="output"))).args[0][joint.num_fwd_outputs:]
    assert saved and not any(ops.is_view(n) for n in saved)


def test_debug_partitioner_prints_banned_ops(capture, capsys):
    joint = capture(lambda x, w: (x @ w).sin(), _x(4, 4), _x(4, 4))
    with functorch_config.patch(debug_partitioner=True):
        min_cut_rematerialization_partition(joint.fresh(), joint.inputs,
                                            num_fwd_outputs=joint.num_fwd_outputs)
    out = capsys.readouterr().out
    assert "Ops banned from rematerialization:" in out and "aten.mm" in out
    assert "Theoretical Activations Stored:" in out


@pytest.mark.parametrize("flag", ["ban_recompute_not_in_allowlist", "ban_recompute_reductions"])
def test_partitioner_reads_torchs_flags_like_ours(flag, capture):
    """torch's flag set alone moves the decision as ours does (issue 27)."""
    case = make_case("views")
    joint = capture(case.module, *(t.clone().requires_grad_() for t in case.inputs))

    def saved_names():
        fw, _ = min_cut_rematerialization_partition(joint.fresh(), joint.inputs,
                                                    num_fwd_outputs=joint.num_fwd_outputs)
        outs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
        return [n.name for n in outs[joint.num_fwd_outputs:]]

    baseline = saved_names()
    with functorch_config.patch(**{flag: False}):
        ours = saved_names()
    with torch._functorch.config.patch(**{flag: False}):
        assert saved_names() == ours
    with functorch_config.patch(aggressive_recomputation=True, ban_recompute_reductions=False):
        assert saved_names() != baseline


def test_policy_context_reads_distance_and_view_flags(capture):
    joint = capture(lambda x: x.sin().cos(), _x(4, 4))
    info = classify(joint.module, joint.num_fwd_outputs)
    with functorch_config.patch(max_dist_from_bw=3, recompute_views=True):
        ctx = P.PolicyContext.create(default_op_types(), info, ALL_ON)
    assert (ctx.max_dist_from_bw, ctx.recompute_views) == (3, True)
    ctx = P.PolicyContext.create(default_op_types(), info, ALL_ON)
    assert (ctx.max_dist_from_bw, ctx.recompute_views) == (1000, False)
