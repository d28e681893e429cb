"""Errors name the culprit: missing metadata, infeasible cuts, bad solver names, bad counts."""

from __future__ import annotations

import pytest
import torch
from aot_partition import (
    InfeasibleMinCutError,
    MissingMetadataError,
    default_partition,
    get_solver,
    min_cut_rematerialization_partition,
)
from aot_partition.mincut import available_solver_names
from zoo import make_case

aten = torch.ops.aten


@pytest.fixture
def mlp_joint(capture):
    case = make_case("mlp")
    return capture(case.module, *(t.clone().requires_grad_() for t in case.inputs))


def _first(joint_module, packet):
    return next(n for n in joint_module.graph.nodes
                if getattr(n.target, "overloadpacket", None) is packet)


def test_node_without_val_is_named(mlp_joint):
    joint = mlp_joint.fresh()
    gelu = _first(joint, aten.gelu)
    del gelu.meta["val"]
    with pytest.raises(MissingMetadataError, match=rf"'{gelu.name}' \(aten\.gelu"):
        min_cut_rematerialization_partition(joint, mlp_joint.inputs,
                                            num_fwd_outputs=mlp_joint.num_fwd_outputs)


def test_infeasible_cut_names_the_path(mlp_joint):
    joint = mlp_joint.fresh()
    gelu = _first(joint, aten.gelu)
    # The gelu is banned from recomputation (the backward materializes it) and, as a tuple,
    # can no longer be saved: no finite cut separates the inputs from the backward.
    gelu.meta["val"] = (gelu.meta["val"],)
    with pytest.raises(InfeasibleMinCutError) as info:
        min_cut_rematerialization_partition(joint, mlp_joint.inputs,
                                            num_fwd_outputs=mlp_joint.num_fwd_outputs)
    message = str(info.value)
    names = [name for name, _ in info.value.path]
    assert names[:2] == [gelu.name, gelu.name] and names[-1] == "sink"
    user = names[2]
    assert user in {u.name for u in gelu.users}
    assert f"source -> {gelu.name} -> {user} -> sink" in message
    assert f"{gelu.name}: cannot recompute: materialized in backward" in message
    assert f"{gelu.name}: cannot save: not a tensor" in message
    assert f"{user}: {user} uses {gelu.name}" in message


def test_unknown_solver_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown min-cut solver 'nope'; valid solvers: "
                                         r".*networkx"):
        get_solver("nope")
    assert "networkx" in available_solver_names() and "scipy" in available_solver_names()


@pytest.mark.parametrize("partition_fn", [default_partition, min_cut_rematerialization_partition])
def test_num_fwd_outputs_out_of_range(mlp_joint, partition_fn):
    with pytest.raises(ValueError, match=r"num_fwd_outputs=99 is out of range: the joint graph "
                                         r"has \d+ outputs"):
        partition_fn(mlp_joint.fresh(), mlp_joint.inputs, num_fwd_outputs=99)
