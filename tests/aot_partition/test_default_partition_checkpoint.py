"""The default partitioner on joints with selective-checkpointing tags: the same split as
torch's ``default_partition`` (same saved values, same ops in each graph), not a min cut."""

from __future__ import annotations

import copy
import operator
from collections import Counter
from functools import partial

import aot_partition
import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._functorch import partitioners as torch_partitioners
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from zoo import checkpoint_policy

aten = torch.ops.aten


def _nop(gm, _inputs):
    return make_boxed_func(gm)


_policy = checkpoint_policy


def _muls(x, w1, w2):
    a = x * 2
    b = a @ w1
    c = b.sin() * a
    d = (c @ w2) * c
    return d.cos().mul(3).sum()


def _norm_and_dropout(x, w1, w2):
    h = F.layer_norm(x @ w1, (8,))  # a multi-output op inside the region
    return F.dropout(torch.relu(h), p=0.5, training=True).mul(w2.sum()).sum()


def _outside_then_region(policy_fn):
    context_fn = partial(create_selective_checkpoint_contexts, policy_fn)

    def fn(x, w1, w2):
        outside = torch.tanh(x) * 2  # a region input computed outside any region
        return checkpoint(_muls, outside, w1, w2, use_reentrant=False, context_fn=context_fn)
    return fn


def _two_regions(policy_fn):
    context_fn = partial(create_selective_checkpoint_contexts, policy_fn)

    def fn(x, w1, w2):
        h = checkpoint(lambda a, w: torch.sin(a @ w) * a, x, w1, use_reentrant=False,
                       context_fn=context_fn)
        return checkpoint(lambda a, w: torch.cos(a @ w).mul(a).sum(), h, w2,
                          use_reentrant=False, context_fn=context_fn)
    return fn


def _region(body, policy_fn):
    context_fn = partial(create_selective_checkpoint_contexts, policy_fn)

    def fn(x, w1, w2):
        return checkpoint(body, x, w1, w2, use_reentrant=False, context_fn=context_fn)
    return fn


CASES = {
    "muls-save-mm": _region(_muls, _policy(must_save={aten.mm})),
    "muls-save-mul": _region(_muls, _policy(must_save={aten.mul})),
    "muls-recompute-all": _region(_muls, _policy(default=CheckpointPolicy.MUST_RECOMPUTE)),
    "muls-prefer-save-sin": _region(_muls, _policy(must_save={aten.sin},
                                                   default=CheckpointPolicy.PREFER_SAVE)),
    "norm-dropout": _region(_norm_and_dropout, _policy(must_save={aten.mm})),
    "outside-input": _outside_then_region(_policy(must_save={aten.mm})),
    "two-regions": _two_regions(_policy(default=CheckpointPolicy.MUST_RECOMPUTE)),
}


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True),
            torch.randn(8, 8, requires_grad=True)]


def _partition_both(fn):
    """Torch's default_partition and ours on the joint AOTAutograd builds for ``fn`` (compiled
    by Dynamo, which turns the checkpoint into tags), each on its own copy, inside the compile
    (torch's RNG replay needs its tracing context): {name: (fw, bw)}, num_fwd_outputs."""
    splits, num_fwd = {}, []

    def record(joint, joint_inputs, **kwargs):
        num_fwd.append(kwargs["num_fwd_outputs"])
        for name, partition_fn in (("ours", aot_partition.default_partition),
                                   ("torch", torch_partitioners.default_partition)):
            splits[name] = partition_fn(copy.deepcopy(joint), joint_inputs, **kwargs)
        return splits["torch"]

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=_nop, bw_compiler=_nop, partition_fn=record)
    torch.compile(fn, backend=backend, fullgraph=True)(*_inputs())
    assert len(num_fwd) == 1
    return splits, num_fwd[0]


def _split_summary(fw, bw, num_fwd_outputs):
    def ops(module):
        return Counter(str(getattr(n.target, "overloadpacket", n.target))
                       for n in module.graph.nodes if n.op == "call_function")

    outputs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    return ops(fw), ops(bw), [_saved_name(n) for n in outputs[num_fwd_outputs:] if n is not None]


def _saved_name(node):
    """A saved node's name; the RNG state of a replayed op (its name is the replay's own
    numbering, torch's or ours) as ``rng_state``."""
    source = node.args[0] if node.target is operator.getitem else None
    if isinstance(source, torch.fx.Node) and str(source.target) == "run_and_save_rng_state":
        return "rng_state"
    return node.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_split_as_torchs_default_partition(case):
    splits, num_fwd = _partition_both(CASES[case])
    their_fw, their_bw, their_saved = _split_summary(*splits["torch"], num_fwd)
    our_fw, our_bw, our_saved = _split_summary(*splits["ours"], num_fwd)
    assert our_saved == their_saved
    assert our_fw == their_fw
    assert our_bw == their_bw


def test_mul_counts_follow_the_tags():
    """Ported in spirit from torch's SAC tests: count ``mul`` in each graph, ours and torch's.
    MUST_SAVE on mul keeps every forward mul out of the backward; with only mm saved, the
    backward runs again the 3 forward muls its gradients read (not the last one, ``* 3``)."""
    counts = {}
    for name in ("muls-save-mul", "muls-save-mm"):
        splits, _ = _partition_both(CASES[name])
        for who, graphs in splits.items():
            counts[name, who] = [sum(1 for n in g.graph.nodes if n.target is aten.mul.Tensor)
                                 for g in graphs]
    assert counts == {("muls-save-mul", "ours"): [4, 8], ("muls-save-mul", "torch"): [4, 8],
                      ("muls-save-mm", "ours"): [4, 11], ("muls-save-mm", "torch"): [4, 11]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_partition_of_tagged_joint_matches_eager(case):
    fn = CASES[case]
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=_nop, bw_compiler=_nop,
                           partition_fn=aot_partition.default_partition)
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    eager_in, compiled_in = _inputs(), _inputs()
    torch.manual_seed(123)
    fn(*eager_in).backward()
    torch.manual_seed(123)
    compiled(*compiled_in).backward()
    for got, want in zip(compiled_in, eager_in, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_mutation_outside_inputs_is_found():
    from aot_partition.fx.checkpoint_split import mutation_outside_inputs

    graph = torch.fx.Graph()
    x = graph.placeholder("primals_1")
    y = graph.call_function(aten.mul.Tensor, (x, 2))
    graph.call_function(aten.add_.Tensor, (y, 1))
    graph.output((y,))
    assert mutation_outside_inputs(graph) is not None
    functional = torch.fx.Graph()
    x = functional.placeholder("primals_1")
    functional.call_function(aten.copy_.default, (x, x))
    functional.output((x,))
    assert mutation_outside_inputs(functional) is None


class _ScaledAfterUse(torch.nn.Module):
    """A checkpointed region reads a buffer that the step then updates in place."""

    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.register_buffer("scale", torch.ones(8))
        self.checkpointed = checkpointed

    def body(self, x):
        return torch.sin(x @ self.w + self.scale)

    def forward(self, x):
        context_fn = partial(create_selective_checkpoint_contexts, _policy())
        h = (checkpoint(self.body, x, use_reentrant=False, context_fn=context_fn)
             if self.checkpointed else self.body(x))
        self.scale.mul_(2)
        return h.sum()


@pytest.mark.parametrize("partition_fn", [aot_partition.default_partition,
                                          torch_partitioners.default_partition],
                         ids=["ours", "torch"])
def test_region_reading_an_input_updated_in_place(partition_fn):
    # Recomputing ``x @ w + scale`` in the backward would read the doubled scale: ours saves
    # it (the gradient of the step as run); torch's saves ``scale`` and trips the version check.
    plain = _ScaledAfterUse(checkpointed=False)
    x = torch.randn(4, 8)
    plain(x).backward()
    module = _ScaledAfterUse(checkpointed=True)
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=_nop, bw_compiler=_nop, partition_fn=partition_fn)
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    if partition_fn is torch_partitioners.default_partition:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            compiled(x).backward()
        return
    compiled(x).backward()
    torch.testing.assert_close(module.w.grad, plain.w.grad)
    torch.testing.assert_close(module.scale, plain.scale)
