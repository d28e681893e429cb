"""Offloading on zoo models: every offloadable saved value goes to host memory, and outputs and
every gradient still equal eager's (aot_module with our partitioner; torch.compile with
backend="aot_pipeline", nop and Inductor compilers; dynamic shapes)."""

from __future__ import annotations

import copy

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition
from aot_partition import partitioners as partitioners_module
from aot_partition.config import PartitionConfig
from aot_partition.fx.passes.offload_ops import offload_to_host, prefetch_to_device
from aot_partition.memory_models.simulator import simulate_partition
from functorch.compile import aot_module, make_boxed_func
from torch.utils.checkpoint import CheckpointPolicy
from zoo import assert_matches_eager, make_case


def _nop(gm, _inputs):
    return make_boxed_func(gm)


def plan_every_offloadable(joint_graph, saved_values, config):
    """A stand-in planner: every saved value computed by a non-view op, contiguous, not a user
    output and not MUST_SAVE (what fx/offload.py accepts)."""
    names = []
    for node in saved_values:
        val = node.meta.get("val")
        if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and not node.target.is_view and isinstance(val, torch.Tensor)
                and not val._is_view() and val.is_contiguous()
                and node.meta.get("recompute") != CheckpointPolicy.MUST_SAVE
                and all(user.op != "output" for user in node.users)):
            names.append(node.name)
    return names


@pytest.mark.parametrize("name", ["mlp", "gpt", "llama", "convnet", "dropout"])
def test_tag_everything_matches_eager(name):
    offloaded = []

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        kept = min_cut_rematerialization_partition(
            copy.deepcopy(joint), joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        for node in joint.graph.nodes:  # tags that cannot be honoured are skipped (a note)
            node.meta["should_offload"] = True
        fw, bw = min_cut_rematerialization_partition(
            joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
            config=PartitionConfig(offload_tagged=True), **kwargs)
        offloaded.extend(n for n in fw.graph.nodes if n.target is offload_to_host)
        assert sum(n.target is prefetch_to_device for n in bw.graph.nodes) == len(offloaded)
        # The same cut with offloads: each value is off the device over a window, no longer.
        with_offload, without = simulate_partition(fw, bw), simulate_partition(*kept)
        assert with_offload.offloaded_bytes > 0 and without.transfers == []
        assert with_offload.peak_bytes <= without.peak_bytes
        return fw, bw

    assert_matches_eager(make_case(name), lambda module: aot_module(
        module, fw_compiler=_nop, bw_compiler=_nop, partition_fn=partition))
    assert offloaded, "nothing was offloaded: the test proves nothing"


@pytest.fixture
def planner(monkeypatch):
    chosen: list[list[str]] = []

    def recording(joint_graph, saved_values, config):
        chosen.append(plan_every_offloadable(joint_graph, saved_values, config))
        return chosen[-1]

    monkeypatch.setattr(partitioners_module, "_offload_planner", lambda: recording)
    # the hook over a cut's fixed saved set (the whole planner: test_offload_planner_e2e.py)
    monkeypatch.setattr(partitioners_module, "_whole_planner", lambda config, regions: None)
    return chosen


@pytest.mark.parametrize(("name", "compiler"), [
    ("gpt", "nop"), ("llama", "nop"),
    pytest.param("mlp", "inductor", marks=pytest.mark.slow)])  # ~25 s: Inductor compiles
def test_torch_compile_with_the_planner_matches_eager(planner, name, compiler):
    torch._dynamo.reset()
    # No cache hit from an earlier run: the planner must run (the key holds the flag, not it).
    with functorch_config.patch(activation_offload_planner=True), \
            torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        assert_matches_eager(make_case(name), lambda module: torch.compile(
            module, backend="aot_pipeline", options={"compiler": compiler}))
    assert planner and planner[0]


def test_dynamic_shapes(planner):
    torch._dynamo.reset()
    case = make_case("mlp")
    with functorch_config.patch(activation_offload_planner=True):
        compiled = torch.compile(case.module, backend="aot_pipeline", dynamic=True,
                                 options={"compiler": "nop"})
        for batch in (3, 5):
            x = torch.randn(batch, case.inputs[0].shape[1], requires_grad=True)
            compiled(x).sum().backward()
            grad = x.grad
            x.grad = None
            case.module.zero_grad()
            case.module(x).sum().backward()
            torch.testing.assert_close(grad, x.grad)
    assert planner and planner[0]
