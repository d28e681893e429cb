"""explain_partition / PartitionReport, DEBUG logging, and the import boundary."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from aot_partition import (
    NodeDecision,
    PartitionReport,
    explain_partition,
    min_cut_rematerialization_partition,
    saved_activation_bytes,
)
from subprocess_limits import SUBPROCESS_TIMEOUT_S
from torch.utils.checkpoint import CheckpointPolicy
from zoo import make_case

aten = torch.ops.aten


@pytest.fixture(scope="module")
def gpt_joint(capture):
    case = make_case("gpt")
    return capture(case.module, *(t.clone() for t in case.inputs))


def test_report_matches_the_partition(gpt_joint):
    report = explain_partition(gpt_joint.module, gpt_joint.inputs,
                               num_fwd_outputs=gpt_joint.num_fwd_outputs)
    fw, bw = min_cut_rematerialization_partition(gpt_joint.fresh(), gpt_joint.inputs,
                                                 num_fwd_outputs=gpt_joint.num_fwd_outputs)
    assert isinstance(report, PartitionReport)
    assert report.saved_bytes == saved_activation_bytes(fw)
    assert report.memory_budget == 1.0
    assert report.solver in ("networkx", "scipy")
    saved_outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0][
        gpt_joint.num_fwd_outputs:]
    assert [d.name for d in report.saved] == [n.name for n in saved_outputs]
    assert all(isinstance(d, NodeDecision) and d.decision == "saved" for d in report.saved)
    bw_ops = {n.name for n in bw.graph.nodes if n.op == "call_function"}
    assert report.recomputed and {d.name for d in report.recomputed} <= bw_ops
    assert all(d.decision == "recomputed" for d in report.recomputed)
    # The forward matmuls are banned (not recomputable) and every ban carries its reason.
    addmm_names = [n.name for n in gpt_joint.module.graph.nodes
                   if n.target is aten.addmm.default]
    assert addmm_names and all(
        report.banned[name] == "not in allowlist: aten.addmm is not a recomputable op"
        for name in addmm_names)
    assert report.banned["primals_1"] == "primal input"
    reasons = {d.reason.split(":")[0] for d in report.saved}
    assert reasons <= {"input", "banned", "cut", "MUST_SAVE annotation", "PREFER_SAVE annotation"}
    text = report.format()
    assert "saved:" in text and "recomputed:" in text and report.saved[0].name in text


def test_explain_leaves_the_joint_graph_untouched(gpt_joint):
    before = str(gpt_joint.module.graph)
    explain_partition(gpt_joint.module, gpt_joint.inputs,
                      num_fwd_outputs=gpt_joint.num_fwd_outputs)
    assert str(gpt_joint.module.graph) == before


def test_report_below_budget_one_names_bans_and_both_solvers(gpt_joint):
    from aot_config import functorch as functorch_config

    with functorch_config.patch(activation_memory_budget_solver="dp", min_cut_solver="scipy"):
        report = explain_partition(gpt_joint.module, gpt_joint.inputs,
                                   num_fwd_outputs=gpt_joint.num_fwd_outputs, memory_budget=0.5)
    assert report.solver == "scipy min-cut, dp budget"
    assert report.banned, "the final cut's bans (with reasons) belong in the report"
    assert any(d.reason.startswith("banned:") for d in report.saved)


def test_report_explains_annotations(capture):
    # The backward multiplies the tangent by sin(x) itself (d/dx of sin(x) * x), so a saved
    # sin cannot be traded for an equal-sized value derived from it. Unannotated, sin is
    # recomputed from x (saved anyway); annotated, it is saved, and the report says why.
    joint = capture(lambda x: (x.sin() * x).sum(), torch.randn(4, 4, requires_grad=True))
    plain = explain_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert "sin" not in {d.name for d in plain.saved}
    module = joint.fresh()
    sin = next(n for n in module.graph.nodes if n.target is aten.sin.default)
    sin.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    report = explain_partition(module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert {d.name: d.reason for d in report.saved}[sin.name] == "MUST_SAVE annotation"


def test_explain_rejects_bad_budget(gpt_joint):
    with pytest.raises(ValueError, match=r"memory budget must be between 0 and 1 .*got 1.5"):
        explain_partition(gpt_joint.module, gpt_joint.inputs,
                          num_fwd_outputs=gpt_joint.num_fwd_outputs, memory_budget=1.5)


def test_decisions_are_logged_at_debug(gpt_joint, caplog):
    with caplog.at_level(logging.DEBUG, logger="aot_partition"):
        min_cut_rematerialization_partition(gpt_joint.fresh(), gpt_joint.inputs,
                                            num_fwd_outputs=gpt_joint.num_fwd_outputs)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("aot_partition")]
    assert any(m.startswith("saved ") for m in messages)
    assert any(m.startswith("banned ") and "not in allowlist" in m for m in messages)


def test_import_does_not_pull_in_downstream_packages():
    code = ("import sys, aot_partition; "
            "bad = [m for m in ('aot_compilers', 'compiled_autograd', 'aot_pipeline') "
            "if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lazy_attributes_and_unknown_attribute():
    import aot_partition

    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        aot_partition.nope  # noqa: B018
    assert callable(aot_partition.core.knapsack.greedy_knapsack)
