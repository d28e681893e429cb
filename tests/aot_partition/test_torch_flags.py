"""torch's own partitioner flags (torch._functorch.config) honoured by ours (issue 27).

A flag set in torch's config and not in ours is used; both set to different values is a
FlagConflictError naming both; nothing set changes nothing.
"""

from __future__ import annotations

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import FlagConflictError, saved_activation_bytes
from aot_partition.config import PartitionConfig
from aot_partition.flags import TORCH_MIRRORED_FLAGS, read_flag
from aot_partition.partitioners import min_cut_rematerialization_partition
from torch._functorch import config as torch_config

from tests.zoo import make_case


def test_every_mirrored_flag_exists_in_both_configs():
    for name in TORCH_MIRRORED_FLAGS:
        assert name in functorch_config.flags(), name
        if not hasattr(torch_config, name):  # an older torch may lack one: then only ours
            continue
        ours = getattr(functorch_config, name)
        if ours is None:  # ours derives it (activation_offload_cpu_gpu_bw): torch's must fit
            theirs = getattr(torch_config, name)
            assert theirs is None or functorch_config.flags()[name].check(theirs) is not None
            continue
        assert type(getattr(torch_config, name)) is type(ours), name


def test_nothing_set_changes_nothing():
    assert PartitionConfig.from_flags() == PartitionConfig()


def _saved(joint):
    fw, _ = min_cut_rematerialization_partition(joint.fresh(), joint.inputs,
                                                num_fwd_outputs=joint.num_fwd_outputs)
    return saved_activation_bytes(fw, joint.num_fwd_outputs)


@pytest.fixture(scope="module")
def gpt_joint():
    from .conftest import capture_joint

    case = make_case("gpt")
    return capture_joint(case.module, *case.inputs)


def test_torchs_budget_is_used_by_a_standalone_partition(gpt_joint):
    full = _saved(gpt_joint)
    with functorch_config.patch(activation_memory_budget=0.5):
        ours_half = _saved(gpt_joint)
    with torch_config.patch(activation_memory_budget=0.5):
        assert read_flag("activation_memory_budget") == 0.5
        torch_half = _saved(gpt_joint)
    assert torch_half == ours_half < full


def test_both_set_to_different_values_is_an_error():
    with torch_config.patch(activation_memory_budget=0.5), \
            functorch_config.patch(activation_memory_budget=0.3), \
            pytest.raises(FlagConflictError) as info:
        PartitionConfig.from_flags()
    assert str(info.value) == (
        "torch._functorch.config.activation_memory_budget = 0.5 and "
        "aot_config.functorch.activation_memory_budget = 0.3: both are set and they differ; "
        "set one of them only (or both to the same value)")


def test_both_set_to_the_same_value_is_fine():
    with torch_config.patch(activation_memory_budget=0.5), \
            functorch_config.patch(activation_memory_budget=0.5):
        assert PartitionConfig.from_flags().memory_budget == 0.5


def test_ours_alone_still_works_and_torch_at_its_default_is_not_a_conflict():
    with functorch_config.patch(activation_memory_budget=0.3):
        assert PartitionConfig.from_flags().memory_budget == 0.3


def test_a_torch_value_ours_cannot_take_is_an_error():
    with torch_config.patch(activation_memory_budget_solver="dynamic_memory_budget_dp"), \
            pytest.raises(FlagConflictError, match=r"activation_memory_budget_solver = "
                                                   r"'dynamic_memory_budget_dp' .* aot_partition "
                                                   r"cannot use it: .*expected one of 'dp'"):
        PartitionConfig.from_flags()


def test_torchs_ban_flags_and_aggressive_recomputation_reach_the_min_cut_options():
    with torch_config.patch(ban_recompute_reductions=False, recompute_views=True):
        config = PartitionConfig.from_flags()
    assert config.options.ban_if_reduction is False and config.recompute_views is True
    with torch_config.patch(aggressive_recomputation=True):
        options = PartitionConfig.from_flags().options
    assert not options.ban_if_not_in_allowlist and options.ban_if_reduction
    with torch_config.patch(activation_memory_budget_runtime_estimator="testing"):
        assert PartitionConfig.from_flags().runtime_estimator == "testing"


def test_a_patch_that_ended_is_not_taken_for_a_set_flag():
    # torch's patch re-assigns the old value when it ends; that is not "set".
    with torch_config.patch(activation_memory_budget=0.5):
        pass
    with functorch_config.patch(activation_memory_budget=0.3):
        assert PartitionConfig.from_flags().memory_budget == 0.3
    assert torch.is_tensor(torch.zeros(1))


def test_a_flag_this_torch_lacks_is_not_taken_for_set():
    # torch 2.11 lacks some flags ours mirrors: ours then decides alone.
    from aot_partition.flags import torch_flag_override

    assert torch_flag_override("no_such_flag_in_torch") == (False, None)


def test_torchtitans_memory_budget_mode_is_honoured(gpt_joint, tmp_path):
    """torchtitan's ``activation_checkpoint.mode = "memory_budget"`` sets torch's budget and,
    with its visualize option, torch's Pareto flags: all three reach our partitioner."""
    folder = tmp_path / "pareto"
    with torch_config.patch(activation_memory_budget=0.5, visualize_memory_budget_pareto=True,
                            memory_budget_pareto_dir=str(folder)):
        saved = _saved(gpt_joint)
    with functorch_config.patch(activation_memory_budget=0.5):
        assert saved == _saved(gpt_joint)
    assert [p.suffix for p in folder.iterdir()] == [".png"]


def test_the_opposite_case_no_pareto_flag_writes_nothing(gpt_joint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with torch_config.patch(activation_memory_budget=0.5):
        _saved(gpt_joint)
    assert list(tmp_path.iterdir()) == []
