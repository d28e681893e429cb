"""Errors name the culprit: missing metadata, infeasible cuts, bad solver names, bad counts."""

from __future__ import annotations

import pytest
import torch
from aot_partition import (
    GraphCycleError,
    InfeasibleMinCutError,
    MissingMetadataError,
    default_partition,
    get_solver,
    min_cut_rematerialization_partition,
)
from aot_partition.core.mincut import available_solver_names
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
    assert f"{gelu.name}: cannot save: " in message and "(not a tensor)" in message
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


@pytest.mark.parametrize("partition", [default_partition, min_cut_rematerialization_partition])
def test_unknown_keyword_argument_is_named(partition, mlp_joint):
    # torch's partitioners raise TypeError here too; silently ignoring it would hide typos.
    with pytest.raises(TypeError, match=rf"^{partition.__name__}\(\) got an unexpected "
                                        r"keyword argument 'static_lifetime_indices'$"):
        partition(mlp_joint.fresh(), mlp_joint.inputs, num_fwd_outputs=mlp_joint.num_fwd_outputs,
                  static_lifetime_indices=[0])


def test_default_partition_accepts_torchs_static_lifetime_input_nodes(mlp_joint):
    fw, bw = default_partition(mlp_joint.fresh(), mlp_joint.inputs,
                               num_fwd_outputs=mlp_joint.num_fwd_outputs,
                               static_lifetime_input_nodes=set())
    assert fw.graph.find_nodes(op="output") and bw.graph.find_nodes(op="output")


@pytest.mark.parametrize("partition", [default_partition, min_cut_rematerialization_partition])
def test_joint_graph_with_a_cycle_names_it(partition, mlp_joint):
    joint = mlp_joint.fresh()
    gelu = _first(joint, aten.gelu)
    user = next(iter(gelu.users))
    gelu.args = (user, *gelu.args[1:])   # gelu now reads its own user: gelu -> user -> gelu
    with pytest.raises(GraphCycleError) as info:
        partition(joint, mlp_joint.inputs, num_fwd_outputs=mlp_joint.num_fwd_outputs)
    assert str(info.value) == (
        f"the joint graph has a cycle: {gelu.name} -> {user.name} -> {gelu.name} (node "
        f"'{gelu.name}' reads '{user.name}', which comes after it). A joint graph must be "
        "acyclic, each node after its inputs, as fx traces it.")
    assert info.value.cycle == [gelu.name, user.name, gelu.name]


def test_joint_graph_out_of_order_is_named(mlp_joint):
    joint = mlp_joint.fresh()
    gelu = _first(joint, aten.gelu)
    last = list(joint.graph.nodes)[-2]
    last.append(gelu.args[0])   # move gelu's input after everything: out of order, no cycle
    with pytest.raises(GraphCycleError, match=rf"^the joint graph is not in topological order "
                                              rf"\(node '\w+' reads '{gelu.args[0].name}'"):
        min_cut_rematerialization_partition(joint, mlp_joint.inputs,
                                            num_fwd_outputs=mlp_joint.num_fwd_outputs)
