"""Every zoo model through aot_module with both partitioners: eager outputs and gradients;
at budget 1.0 our min-cut saves no more bytes than torch's own partitioner."""

from __future__ import annotations

import aot_partition
import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import (
    default_partition,
    min_cut_rematerialization_partition,
    saved_activation_bytes,
)
from torch._functorch import partitioners as torch_partitioners
from zoo import ZOO, assert_matches_eager, make_case

PARTITIONERS = {"default": default_partition, "min_cut": min_cut_rematerialization_partition}


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_matches_eager(name, partitioner, aot_with):
    assert_matches_eager(make_case(name), aot_with(PARTITIONERS[partitioner]))


def _case_inputs(case):
    return tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in case.inputs)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_min_cut_saves_no_more_than_torch(name, capture):
    case = make_case(name)
    joint = capture(case.module, *_case_inputs(case))
    fw_torch, _ = torch_partitioners.min_cut_rematerialization_partition(
        joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    handed_in = joint.fresh()
    graph_before, code_before = str(handed_in.graph), handed_in.code
    users_before = [[u.name for u in n.users] for n in handed_in.graph.nodes]
    fw_ours, _ = min_cut_rematerialization_partition(
        handed_in, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    ours = saved_activation_bytes(fw_ours, joint.num_fwd_outputs)
    theirs = saved_activation_bytes(fw_torch, joint.num_fwd_outputs)
    assert 0 < ours <= theirs, (name, ours, theirs)
    # The joint handed in keeps its graph (merges undone, users in order) and its code.
    assert str(handed_in.graph) == graph_before and handed_in.code == code_before
    assert [[u.name for u in n.users] for n in handed_in.graph.nodes] == users_before


@pytest.mark.parametrize("solver", ["networkx", "scipy"])
def test_solvers_agree_on_gpt(solver, capture):
    case = make_case("gpt")
    joint = capture(case.module, *_case_inputs(case))
    with functorch_config.patch(min_cut_solver="networkx"):
        fw_ref, _ = min_cut_rematerialization_partition(
            joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    with functorch_config.patch(min_cut_solver=solver):
        fw, _ = min_cut_rematerialization_partition(
            joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert saved_activation_bytes(fw) == saved_activation_bytes(fw_ref)


def test_default_partition_saves_more_than_min_cut_on_gpt(capture):
    """The default split saves every forward value the backward reads; min-cut recomputes."""
    case = make_case("gpt")
    joint = capture(case.module, *_case_inputs(case))
    fw_default, _ = default_partition(joint.fresh(), joint.inputs,
                                      num_fwd_outputs=joint.num_fwd_outputs)
    fw_min_cut, _ = min_cut_rematerialization_partition(
        joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert saved_activation_bytes(fw_min_cut) < saved_activation_bytes(fw_default)


def test_saved_activation_bytes_counts_saved_tensors_beyond_the_inputs(capture):
    joint = capture(lambda x, w: (x @ w).relu(), torch.randn(4, 8, requires_grad=True),
                    torch.randn(8, 8, requires_grad=True))
    fw, _ = default_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    saved = outputs[joint.num_fwd_outputs:]
    # x and w are saved too, but they are inputs (alive anyway): the one measure skips them.
    assert any(n.op == "placeholder" for n in saved)
    expected = sum(n.meta["val"].numel() * n.meta["val"].element_size() for n in saved
                   if n.op != "placeholder")
    assert expected == 4 * 8 * 4  # the relu's output
    assert saved_activation_bytes(fw) == expected
    assert saved_activation_bytes(fw, joint.num_fwd_outputs) == expected


def test_partitioners_accept_static_lifetime_input_indices(capture):
    case = make_case("mlp")
    joint = capture(case.module, *_case_inputs(case))
    for partition in PARTITIONERS.values():
        fw, bw = partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                           static_lifetime_input_indices=[0, 1])
        assert fw.graph.find_nodes(op="output") and bw.graph.find_nodes(op="output")
    assert aot_partition.default_partition is default_partition


@pytest.mark.parametrize("lazy", [False, True])
def test_module_class_follows_torch_lazy_setting(lazy, capture):
    """Inside torch.compile (lazy graph modules on) ours returns torch's lazy modules, whose
    code is generated on first use, as torch's forward is (torch rebuilds its backward as a
    plain GraphModule when reordering it); elsewhere our scriptable CodeOnFirstUseGraphModule
    (test_graph_modules.py), where torch returns plain GraphModules. Same graphs either way."""
    from aot_partition.fx.graph_modules import CodeOnFirstUseGraphModule
    from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module

    case = make_case("gpt")
    joint = capture(case.module, *_case_inputs(case))
    with _use_lazy_graph_module(lazy):
        ours = min_cut_rematerialization_partition(
            joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
        theirs = torch_partitioners.min_cut_rematerialization_partition(
            joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    expected_class = _LazyGraphModule if lazy else CodeOnFirstUseGraphModule
    assert [type(gm).__mro__[1] for gm in ours] == [expected_class, expected_class]
    assert isinstance(theirs[0], _LazyGraphModule) == lazy
    fw, bw = ours
    eager_fw, eager_bw = min_cut_rematerialization_partition(
        joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert fw.code == eager_fw.code and bw.code == eager_bw.code  # .code generates it


@pytest.mark.parametrize("name", sorted(ZOO))
def test_extracted_graphs_have_no_dead_code(name, capture):
    """Extraction copies only what the outputs need: fx's dead-code pass finds nothing."""
    case = make_case(name)
    joint = capture(case.module, *_case_inputs(case))
    for gm in min_cut_rematerialization_partition(
            joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs):
        before = [n.name for n in gm.graph.nodes]
        assert not gm.graph.eliminate_dead_code(), name
        assert [n.name for n in gm.graph.nodes] == before
