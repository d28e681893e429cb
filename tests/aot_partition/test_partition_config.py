"""One PartitionConfig per partition call: every decision is a function of (graph, config)."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path

import aot_partition
import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import MinCutOptions, explain_partition
from aot_partition import config as config_module
from aot_partition import partitioners as partitioners_module
from aot_partition.config import PartitionConfig
from aot_partition.fx import policy as P
from aot_partition.fx.sizes import saved_activation_bytes
from aot_partition.partitioners import partition_with_report
from zoo import make_case

ALL_ON = MinCutOptions(True, True, True, True, True)
PACKAGE_DIR = Path(aot_partition.__file__).parent


def _joint(capture, name="gpt"):
    case = make_case(name)
    return capture(case.module, *case.inputs)


def _saved_bytes(joint, **kwargs):
    fw, _, report = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                          **kwargs)
    return saved_activation_bytes(fw, joint.num_fwd_outputs), report


# ---- the config itself -----------------------------------------------------------------------

def test_defaults_equal_the_flags_defaults_field_by_field():
    declared = functorch_config.flags()
    config = PartitionConfig()
    for name, flag in config_module._FLAG_OF_FIELD.items():
        assert getattr(config, name) == declared[flag].default, (name, flag)
    # Every field but ``options`` is a flag; options are read from the ban flags.
    assert {f.name for f in fields(PartitionConfig)} == {*config_module._FLAG_OF_FIELD, "options"}
    assert config.options == MinCutOptions._from(lambda flag: declared[flag].default)


def test_from_flags_reads_patches_and_overrides():
    with functorch_config.patch(activation_memory_budget=0.25, cse=False,
                                aggressive_recomputation=True):
        config = PartitionConfig.from_flags(min_cut_solver="networkx")
    assert (config.memory_budget, config.cse, config.min_cut_solver) == (0.25, False, "networkx")
    assert config.options == MinCutOptions(False, False, False, False, True)
    assert PartitionConfig.from_flags() == PartitionConfig()


def test_unknown_override_is_a_type_error_naming_the_valid_fields():
    with pytest.raises(TypeError, match=r"PartitionConfig has no field 'memory_bugdet'; valid: "
                                        r"options, recompute_views, .*memory_budget, "):
        PartitionConfig.from_flags(memory_bugdet=0.5)


# ---- the config decides, not the flags -------------------------------------------------------

def test_explicit_config_wins_over_patched_flags(capture):
    joint = _joint(capture)
    full, _ = _saved_bytes(joint)
    with functorch_config.patch(activation_memory_budget=0.0):
        lowest, _ = _saved_bytes(joint)
        explicit, report = _saved_bytes(joint, config=PartitionConfig(memory_budget=1.0))
    assert lowest < full
    assert explicit == full
    assert report.config == PartitionConfig(memory_budget=1.0)


def test_flags_are_read_once_per_partition(capture, monkeypatch):
    joint = _joint(capture, "mlp")
    calls = []
    original = PartitionConfig.from_flags.__func__

    def counting(cls, **overrides):
        calls.append(overrides)
        return original(cls, **overrides)

    monkeypatch.setattr(PartitionConfig, "from_flags", classmethod(counting))
    for budget in (None, 0.5):
        calls.clear()
        _saved_bytes(joint, memory_budget=budget)
        assert len(calls) == 1, budget
        calls.clear()
        _saved_bytes(joint, memory_budget=budget, config=PartitionConfig())
        assert calls == [], budget


def test_a_flag_changed_during_a_partition_changes_nothing(capture, monkeypatch):
    joint = _joint(capture)
    expected, _ = _saved_bytes(joint)
    real_classify = partitioners_module.classify

    def classify_then_patch(*args, **kwargs):
        # Half-way through the call (after the config was built), as another thread might.
        monkeypatch.setattr(functorch_config, "activation_memory_budget", 0.0)
        monkeypatch.setattr(functorch_config, "ban_recompute_reductions", False)
        return real_classify(*args, **kwargs)

    monkeypatch.setattr(partitioners_module, "classify", classify_then_patch)
    during, report = _saved_bytes(joint)
    assert during == expected
    assert report.memory_budget == 1.0 and report.config == PartitionConfig()
    monkeypatch.undo()
    with functorch_config.patch(activation_memory_budget=0.0):
        assert _saved_bytes(joint)[0] < expected  # the same patch, made before, does change it


def test_flag_changes_after_the_config_is_built_change_nothing(capture):
    joint = _joint(capture)
    config = PartitionConfig.from_flags()
    expected, _ = _saved_bytes(joint, config=config)
    with functorch_config.patch(activation_memory_budget=0.0, cse=False,
                                aggressive_recomputation=True, min_cut_solver="networkx"):
        assert _saved_bytes(joint, config=config)[0] == expected


def test_read_flag_is_called_only_in_config_py():
    callers = sorted(
        str(path.relative_to(PACKAGE_DIR)) for path in PACKAGE_DIR.rglob("*.py")
        if re.search(r"(?<!def )\bread_flag\(", path.read_text()))
    assert callers == ["config.py"]


# ---- the rules a config switches on, in one place --------------------------------------------

def test_active_ban_rules_all_on_and_aggressive():
    all_on = [name for name, _ in P.active_ban_rules(ALL_ON)]
    assert all_on == ["never_recomputable", "collective", "not_in_allowlist",
                      "materialized_in_backward", "too_far_from_backward", "reduction"]
    with functorch_config.patch(aggressive_recomputation=True):
        aggressive_options = PartitionConfig.from_flags().options
    aggressive = [name for name, _ in P.active_ban_rules(aggressive_options)]
    assert aggressive == ["never_recomputable", "collective", "random_op", "compute_intensive",
                          "too_far_from_backward", "reduction"]
    assert [name for name, _ in P.active_graph_rules(ALL_ON)] == [
        "ban_used_far_apart", "ban_long_fusible_chains"]
    assert P.active_graph_rules(aggressive_options) == ()
    assert P.active_rule_names(replace(ALL_ON, ban_if_reduction=False,
                                       ban_if_used_far_apart=False)) == (
        "never_recomputable", "collective", "not_in_allowlist", "materialized_in_backward",
        "too_far_from_backward", "ban_long_fusible_chains")


def test_predicates_test_only_the_graph(capture):
    # Off options no longer silence a predicate: ban_reason asks only the active ones.
    joint = capture(lambda x: (x.sum(-1, keepdim=True) * x).sin(),
                    torch.randn(4, 16, requires_grad=True))
    total = next(n for n in joint.module.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList)
    from aot_partition import classify, default_op_types

    info = classify(joint.module, joint.num_fwd_outputs)
    off = P.PolicyContext(default_op_types(), info, replace(ALL_ON, ban_if_reduction=False),
                          False, 1000)
    assert P.reduction(total, off) == "reduction: output 16x smaller than inputs"
    assert P.ban_reason(total, off) is None


def test_report_records_the_rules_and_the_config(capture):
    joint = _joint(capture, "mlp")
    report = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert report.active_rules == P.active_rule_names(ALL_ON)
    assert report.config == PartitionConfig()
    config = PartitionConfig(options=MinCutOptions(False, False, False, False, True))
    report = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                               config=config)
    assert report.active_rules == ("never_recomputable", "collective", "random_op",
                                   "compute_intensive", "too_far_from_backward", "reduction")
    assert report.config == config
    # explain_partition's memory_budget stays an override on top of the config.
    report = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                               memory_budget=0.0, config=config)
    assert report.memory_budget == 0.0 and report.config == config


# ---- garbage collection is paused for one partition, and restored --------------------------

@pytest.mark.parametrize("enabled", [True, False])
def test_gc_is_paused_during_a_partition_and_restored(capture, monkeypatch, enabled):
    import gc

    joint = _joint(capture, "mlp")
    seen = []
    original = partitioners_module._partition_prepared

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(partitioners_module, "_partition_prepared", spy)
    (gc.enable if enabled else gc.disable)()
    try:
        _saved_bytes(joint)
        assert seen == [False] and gc.isenabled() is enabled
        with pytest.raises(ValueError, match="activation memory budget must be between 0 and 1"):
            partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                  memory_budget=2.0)
        assert gc.isenabled() is enabled  # restored after an error too
    finally:
        gc.enable()
