"""Selective activation checkpointing: annotations decide what is saved and recomputed."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from aot_partition import default_partition, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from zoo import checkpoint_policy

aten = torch.ops.aten


def _saved_nodes(fw, num_fwd_outputs):
    outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    return [n for n in outputs[num_fwd_outputs:] if n is not None]


def _packets(nodes):
    return {getattr(n.target, "overloadpacket", n.target) for n in nodes}


_policy = checkpoint_policy


def _block(x, w1, w2):
    h = torch.sigmoid(x @ w1)
    return torch.cos(h @ w2).sum(-1)


def _checkpointed(policy_fn, body=_block):
    context_fn = partial(create_selective_checkpoint_contexts, policy_fn)

    def fn(x, w1, w2):
        return checkpoint(body, x, w1, w2, use_reentrant=False, context_fn=context_fn)
    return fn


def _inputs(seed=0, device="cpu"):
    torch.manual_seed(seed)
    return [torch.randn(4, 8, device=device, requires_grad=True),
            torch.randn(8, 8, device=device, requires_grad=True),
            torch.randn(8, 8, device=device, requires_grad=True)]


def _compile_and_compare(fn, partition_fn, split_with_recording, nop_compiler, seed=0,
                         device="cpu"):
    recording, records = split_with_recording(partition_fn)
    backend = aot_autograd(fw_compiler=nop_compiler, bw_compiler=nop_compiler,
                           partition_fn=recording)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    eager_in, compiled_in = _inputs(seed, device), _inputs(seed, device)
    torch.manual_seed(123)
    expected = fn(*eager_in)
    expected.sum().backward()
    torch.manual_seed(123)
    got = compiled(*compiled_in)
    got.sum().backward()
    torch.testing.assert_close(got, expected)
    for a, b in zip(compiled_in, eager_in):
        torch.testing.assert_close(a.grad, b.grad)
    assert len(records) == 1
    return records[0]


@pytest.mark.parametrize("partition_fn", [min_cut_rematerialization_partition,
                                          default_partition])
def test_must_save_is_saved_and_must_recompute_is_not(partition_fn, split_with_recording,
                                                       nop_compiler):
    policy = _policy(must_save={aten.mm}, must_recompute={aten.sigmoid})
    fw, bw, num_fwd = _compile_and_compare(_checkpointed(policy), partition_fn,
                                           split_with_recording, nop_compiler)
    saved = _saved_nodes(fw, num_fwd)
    assert aten.mm in _packets(saved)
    assert aten.sigmoid not in _packets(saved)
    # The recomputed sigmoid runs again in the backward.
    assert aten.sigmoid in _packets(n for n in bw.graph.nodes if n.op == "call_function")


def test_prefer_save_everything_recomputes_nothing(split_with_recording, nop_compiler):
    policy = _policy(default=CheckpointPolicy.PREFER_SAVE)
    fw, bw, _ = _compile_and_compare(_checkpointed(policy), min_cut_rematerialization_partition,
                                     split_with_recording, nop_compiler)
    bw_ops = _packets(n for n in bw.graph.nodes if n.op == "call_function")
    assert aten.sigmoid not in bw_ops and aten.cos not in bw_ops


def test_must_recompute_everything_saves_only_inputs(split_with_recording, nop_compiler):
    policy = _policy(default=CheckpointPolicy.MUST_RECOMPUTE)
    fw, bw, num_fwd = _compile_and_compare(_checkpointed(policy),
                                           min_cut_rematerialization_partition,
                                           split_with_recording, nop_compiler)
    saved = _saved_nodes(fw, num_fwd)
    assert all(n.op == "placeholder" for n in saved), [n.name for n in saved]


def _two_regions(policy_fn):
    context_fn = partial(create_selective_checkpoint_contexts, policy_fn)

    def first(x, w1):
        return torch.sin(x @ w1)

    def second(h, w2):
        return torch.cos(h @ w2)

    def fn(x, w1, w2):
        h = checkpoint(first, x, w1, use_reentrant=False, context_fn=context_fn)
        return checkpoint(second, h, w2, use_reentrant=False, context_fn=context_fn).sum(-1)
    return fn


def test_boundary_between_consecutive_regions_is_saved(split_with_recording, nop_compiler):
    """Tag clean-up: the value crossing from one checkpoint region to the next is saved."""
    policy = _policy(default=CheckpointPolicy.MUST_RECOMPUTE)
    fw, bw, num_fwd = _compile_and_compare(_two_regions(policy),
                                           min_cut_rematerialization_partition,
                                           split_with_recording, nop_compiler)
    assert aten.sin in _packets(_saved_nodes(fw, num_fwd))


def _dropout_block(x, w1, w2):
    h = torch.nn.functional.dropout(torch.relu(x @ w1), p=0.5, training=True)
    return (h @ w2).sum(-1)


@pytest.mark.parametrize("partition_fn", [min_cut_rematerialization_partition,
                                          default_partition])
def test_recomputed_dropout_reproduces_forward_mask(partition_fn, split_with_recording,
                                                    nop_compiler):
    """RNG functionalization: the backward replays the forward's RNG state, so gradients
    equal eager checkpointing (which also restores the RNG state) exactly."""
    policy = _policy(default=CheckpointPolicy.MUST_RECOMPUTE)
    fw, bw, num_fwd = _compile_and_compare(_checkpointed(policy, _dropout_block), partition_fn,
                                           split_with_recording, nop_compiler)
    from aot_partition.fx.passes.rng_ops import run_and_save_rng_state, run_with_rng_state

    assert any(n.target is run_and_save_rng_state for n in fw.graph.nodes)
    assert any(n.target is run_with_rng_state for n in bw.graph.nodes)
    rng_inputs = [n for n in bw.graph.find_nodes(op="placeholder") if "rng_state" in n.name]
    assert len(rng_inputs) == 1


@pytest.mark.cuda
def test_recomputed_dropout_reproduces_forward_mask_on_cuda(split_with_recording, nop_compiler):
    policy = _policy(default=CheckpointPolicy.MUST_RECOMPUTE)
    fw, bw, _ = _compile_and_compare(_checkpointed(policy, _dropout_block),
                                     min_cut_rematerialization_partition, split_with_recording,
                                     nop_compiler, device="cuda")
    rng_inputs = [n for n in bw.graph.find_nodes(op="placeholder") if "rng_state" in n.name]
    assert len(rng_inputs) == 1
