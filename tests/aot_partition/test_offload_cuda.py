"""Offloading on a real GPU: pinned host memory, the side stream, the events (skipped without
CUDA; the CPU tests check the graphs' structure and numerics)."""

from __future__ import annotations

import pytest
import torch
from aot_partition import min_cut_rematerialization_partition
from aot_partition.config import PartitionConfig
from aot_partition.fx.passes import offload_ops
from functorch.compile import aot_function, make_boxed_func

pytestmark = pytest.mark.cuda


def test_copies_go_through_pinned_memory_on_the_transfer_stream():
    device = torch.device("cuda", torch.cuda.current_device())
    value = torch.randn(1024, 1024, device=device)
    host = offload_ops.offload_to_host(value)
    assert host.device.type == "cpu" and host.is_pinned()
    side = offload_ops._transfer_streams[device]
    assert side != torch.cuda.current_stream(device)
    assert host.data_ptr() in offload_ops._pending  # its event, for the wait
    assert offload_ops.wait_offload(host, value) is host
    assert host.data_ptr() not in offload_ops._pending
    torch.testing.assert_close(host, value.cpu())
    back = offload_ops.prefetch_to_device(host, device)
    assert back.device == device
    ready = offload_ops.wait_prefetch(back, host)
    assert ready is back
    torch.testing.assert_close(ready, value)


def test_pageable_host_memory_when_asked():
    value = torch.randn(256, device="cuda")
    host = offload_ops.offload_to_host(value, False)
    assert not host.is_pinned()
    torch.testing.assert_close(offload_ops.wait_offload(host, value), value.cpu())


def test_a_wait_without_its_copy_is_an_error():
    value = torch.randn(8, device="cuda")
    with pytest.raises(RuntimeError, match="no copy in flight"):
        offload_ops.wait_prefetch(value, value.cpu())


def two_layers(x, w1, w2):
    return (torch.tanh(torch.relu(x @ w1) @ w2) @ w2.t()).sum()


def test_offloaded_step_on_cuda_matches_eager():
    forwards = []

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        for node in joint.graph.nodes:
            node.meta["should_offload"] = node.name in ("relu", "tanh")
        fw, bw = min_cut_rematerialization_partition(
            joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
            config=PartitionConfig(offload_tagged=True), **kwargs)
        forwards.append(fw)
        return fw, bw

    torch.manual_seed(0)
    inputs = [torch.randn(256, 256, device="cuda", requires_grad=True) for _ in range(3)]
    nop = lambda gm, _: make_boxed_func(gm)  # noqa: E731
    aot_function(two_layers, nop, nop, partition_fn=partition)(*inputs).backward()
    grads = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    two_layers(*inputs).backward()
    for got, t in zip(grads, inputs):
        torch.testing.assert_close(got, t.grad)
    copies = [n for n in forwards[0].graph.nodes if n.target is offload_ops.offload_to_host]
    assert len(copies) == 2
    assert not offload_ops._pending  # every copy was waited for
