"""The partition's modules generate their Python code on first use (``lazy_partition_modules``).

A direct call gets ``CodeOnFirstUseGraphModule``s: no code until a call, ``.code``, ``str()``,
pickling or ``torch.jit.script`` (which cannot script torch's own lazy modules); the flag off
gives the plain GraphModules torch's partitioner returns; inside torch.compile's lazy mode
torch's own ``_LazyGraphModule``. Every variant computes eager's outputs and gradients.
"""

from __future__ import annotations

import copy
import inspect
import pickle
import threading

import pytest
import torch
import torch.fx as fx
from aot_config import functorch as functorch_config
from aot_partition import default_partition, min_cut_rematerialization_partition
from aot_partition.fx.graph_modules import CodeOnFirstUseGraphModule, has_generated_code
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module
from zoo import assert_matches_eager, make_case

PARTITIONERS = {"default": default_partition, "min_cut": min_cut_rematerialization_partition}


def _inputs(case):
    return tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in case.inputs)


@pytest.fixture(scope="module")
def gpt_joint(capture):
    case = make_case("gpt")
    return capture(case.module, *_inputs(case))


def _partition(joint, partitioner=min_cut_rematerialization_partition):
    return partitioner(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)


def _plain(module: fx.GraphModule) -> fx.GraphModule:
    """The same graph in a plain GraphModule (its code generated now), for reference runs."""
    return fx.GraphModule(module, copy.deepcopy(module.graph))


def _forward_inputs(joint):
    """Real tensors shaped like the joint's forward inputs (token ids below every vocab)."""
    torch.manual_seed(0)
    primals, _tangents = joint.inputs
    return [torch.randn(t.shape, dtype=t.dtype) if t.is_floating_point()
            else torch.randint(0, 8, t.shape, dtype=t.dtype) for t in primals]


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
def test_direct_call_defers_code_until_first_use(gpt_joint, partitioner):
    fw, bw = _partition(gpt_joint, PARTITIONERS[partitioner])
    for module in (fw, bw):
        assert isinstance(module, CodeOnFirstUseGraphModule)
        assert not has_generated_code(module) and "_code" not in module.__dict__
    args = _forward_inputs(gpt_joint)
    expected = _plain(fw)(*args)
    got = fw(*args)
    assert has_generated_code(fw) and not has_generated_code(bw)
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want)


def test_flag_off_gives_plain_modules_with_code(gpt_joint):
    with functorch_config.patch(lazy_partition_modules=False):
        fw, bw = _partition(gpt_joint)
    for module in (fw, bw):
        assert not isinstance(module, _LazyGraphModule)
        assert "_code" in module.__dict__ and has_generated_code(module)


def test_inside_torch_compile_lazy_mode_torch_lazy_modules(gpt_joint):
    with _use_lazy_graph_module(True):
        fw, bw = _partition(gpt_joint)
    for module in (fw, bw):
        assert type(module).__mro__[1] is _LazyGraphModule
        assert not has_generated_code(module)


@pytest.mark.parametrize("lazy", [True, False], ids=["code_on_first_use", "code_at_build"])
@pytest.mark.parametrize("name", ["gpt", "dropout", "convnet"])
def test_zoo_matches_eager_either_way(name, lazy, aot_with):
    with functorch_config.patch(lazy_partition_modules=lazy):
        assert_matches_eager(make_case(name), aot_with(min_cut_rematerialization_partition))


def test_torch_jit_script_reads_the_real_forward(gpt_joint):
    fw, _ = _partition(gpt_joint)
    for node in fw.graph.nodes:  # TorchScript calls packets, not overloads (as ts_compile)
        if isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
    fw.recompile()
    assert not has_generated_code(fw)
    scripted = torch.jit.script(fw)
    args = _forward_inputs(gpt_joint)
    for want, have in zip(_plain(fw)(*args), scripted(*args)):
        torch.testing.assert_close(have, want)
    # Why the class exists: torch's own lazy module cannot be scripted before its first call.
    torch_lazy = _LazyGraphModule(fw, copy.deepcopy(fw.graph))
    with pytest.raises(RuntimeError):
        torch.jit.script(torch_lazy)


def test_code_str_inspect_pickle_and_copies(gpt_joint):
    fw, bw = _partition(gpt_joint)
    assert "def forward" in bw.code and has_generated_code(bw)
    fw_str, _ = _partition(gpt_joint)
    assert "def forward" in str(fw_str)
    fw_src, _ = _partition(gpt_joint)
    assert inspect.getsource(fw_src.forward).startswith("def forward")
    args = _forward_inputs(gpt_joint)
    expected = _plain(fw)(*args)
    fw_copy = copy.deepcopy(fw)
    assert not has_generated_code(fw_copy)  # a copy stays lazy until used
    fw_pickled = pickle.loads(pickle.dumps(fw))
    traced = fx.symbolic_trace(_partition(gpt_joint)[0])
    for module in (fw_copy, fw_pickled, traced):
        for want, have in zip(expected, module(*args)):
            torch.testing.assert_close(have, want)


def test_recompile_after_an_edit_regenerates_on_next_use():
    def f(x):
        return torch.relu(x) + 1

    traced = fx.symbolic_trace(f)
    module = CodeOnFirstUseGraphModule(traced, traced.graph)
    x = torch.randn(5)
    torch.testing.assert_close(module(x), f(x))
    for node in module.graph.nodes:
        if node.target is torch.relu:
            node.target = torch.sigmoid
    module.recompile()
    assert not has_generated_code(module)
    torch.testing.assert_close(module(x), torch.sigmoid(x) + 1)
    assert "sigmoid" in module.code


def test_first_use_from_several_threads(gpt_joint):
    fw, _ = _partition(gpt_joint)
    args = _forward_inputs(gpt_joint)
    expected = _plain(fw)(*args)
    results: list = [None] * 4
    start = threading.Barrier(len(results))

    def run(i: int) -> None:
        start.wait()
        results[i] = fw(*args)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        for want, have in zip(expected, got):
            torch.testing.assert_close(have, want)
