"""Dynamic shapes: torch.compile(dynamic=True) with our partitioners as partition_fn."""

from __future__ import annotations

import pytest
import torch
from aot_partition import default_partition, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch.fx.experimental.proxy_tensor import is_sym_node
from zoo import make_case, run_with_grads

# zoo.run_with_grads tests ``call or module``; an OptimizedModule has no truth value, so the
# compiled module is always passed wrapped in a lambda.


def _assert_close_runs(a, b):
    (out_a, grads_a, in_a), (out_b, grads_b, in_b) = a, b
    torch.testing.assert_close(out_a, out_b, atol=1e-5, rtol=1e-4)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4)
    for x, y in zip(in_a, in_b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("partition_fn", [min_cut_rematerialization_partition,
                                          default_partition])
def test_dynamic_shapes_match_eager(partition_fn, split_with_recording, nop_compiler):
    recording, records = split_with_recording(partition_fn)
    backend = aot_autograd(fw_compiler=nop_compiler, bw_compiler=nop_compiler,
                           partition_fn=recording)
    torch._dynamo.reset()
    case = make_case("views")
    eager = case.fresh().module
    compiled_module = case.fresh().module
    compiled = torch.compile(compiled_module, backend=backend, dynamic=True)
    for batch in (4, 6):
        torch.manual_seed(batch)
        x = torch.randn(batch, 16)
        _assert_close_runs(run_with_grads(compiled_module, (x,), call=lambda *a: compiled(*a)),
                           run_with_grads(eager, (x,)))
    fw, bw, num_fwd = records[0]
    placeholders = list(fw.graph.find_nodes(op="placeholder"))
    assert any(is_sym_node(p) for p in placeholders), "graph was not traced with symbolic sizes"
    outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    saved = list(outputs[num_fwd:])
    sym_saved = [n for n in saved if is_sym_node(n)]
    assert sym_saved, "the backward needs the batch size: a SymInt must be saved"
    # AOTAutograd's convention: saved symbolic scalars come after every saved tensor.
    first_sym = saved.index(sym_saved[0])
    assert all(is_sym_node(n) for n in saved[first_sym:])
    assert len(records) == 1, "dynamic=True must not recompile for a new batch size"


def test_dynamic_mlp_min_cut_matches_eager_for_two_batch_sizes(split_with_recording, nop_compiler):
    recording, records = split_with_recording(min_cut_rematerialization_partition)
    backend = aot_autograd(fw_compiler=nop_compiler, bw_compiler=nop_compiler,
                           partition_fn=recording)
    torch._dynamo.reset()
    case = make_case("mlp")
    eager = case.fresh().module
    compiled_module = case.fresh().module
    compiled = torch.compile(compiled_module, backend=backend, dynamic=True)
    (x,) = case.inputs
    for batch in (x, torch.cat([x, x + 1.0])):
        _assert_close_runs(run_with_grads(compiled_module, (batch,), call=lambda *a: compiled(*a)),
                           run_with_grads(eager, (batch,)))
    assert len(records) == 1


def test_dynamic_min_cut_saves_no_more_than_torch(nop_compiler):
    """On a joint graph with symbolic sizes (hinted), ours saves no more bytes than torch's."""
    import copy

    from aot_partition import saved_activation_bytes
    from torch._functorch import partitioners as torch_partitioners

    sizes: list[tuple[int, int]] = []

    def both(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        fw_torch, _ = torch_partitioners.min_cut_rematerialization_partition(
            copy.deepcopy(joint), joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs,
                                                     num_fwd_outputs=num_fwd_outputs, **kwargs)
        sizes.append((saved_activation_bytes(fw, num_fwd_outputs),
                      saved_activation_bytes(fw_torch, num_fwd_outputs)))
        return fw, bw

    torch._dynamo.reset()
    case = make_case("views")
    backend = aot_autograd(fw_compiler=nop_compiler, bw_compiler=nop_compiler, partition_fn=both)
    compiled = torch.compile(case.module, backend=backend, dynamic=True)
    compiled(case.inputs[0].clone().requires_grad_()).sum().backward()
    assert len(sizes) == 1
    ours, theirs = sizes[0]
    assert 0 < ours <= theirs
