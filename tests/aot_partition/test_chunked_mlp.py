"""The chunked token-wise MLP ops (aot_partition.split.chunked_mlp) against torch's own
``down(act(up(x)))`` and ``down(act(gate(x)) * up(x))``: output and the gradient of every input,
over random shapes, chunk counts, activations, biases and token dims; bf16 no further from
fp64 than eager's bf16; opcheck, FLOPs, scratch, roofline and bad arguments."""

from __future__ import annotations

import random

import pytest
import torch
from aot_partition.split.chunked_mlp import ACTIVATIONS, reference_mlp, token_mlp, workspace_bytes

NAMES = ("x", "up_weight", "up_bias", "gate_weight", "gate_bias", "down_weight", "down_bias")


def _case(rng: random.Random, dtype: torch.dtype = torch.float64) -> dict:
    lead = rng.choice([(rng.randint(0, 40),), (rng.randint(1, 3), rng.randint(1, 17))])
    dim, hidden, out = rng.randint(1, 12), rng.randint(1, 40), rng.randint(1, 12)
    gated, bias = rng.random() < 0.5, rng.random() < 0.5
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()

    tokens = 1
    for s in lead:
        tokens *= s
    return dict(
        x=make(*lead, dim), up_weight=make(hidden, dim), up_bias=make(hidden) if bias else None,
        gate_weight=make(hidden, dim) if gated else None,
        gate_bias=make(hidden) if gated and bias else None,
        down_weight=make(out, hidden), down_bias=make(out) if bias else None,
        activation=rng.choice(ACTIVATIONS),
        chunks=rng.choice([1, 2, 3, 7, max(1, tokens), tokens + 3]))


def _run(case: dict, chunked: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    args = [case[k] for k in NAMES]
    if chunked:
        y = token_mlp(*args, case["activation"], case["chunks"])
    else:
        y = reference_mlp(*args, case["activation"])
    grad_out = torch.randn(y.shape, generator=torch.Generator().manual_seed(7),
                           dtype=torch.float64).to(y.dtype)
    leaves = [a for a in args if a is not None]
    return y, list(torch.autograd.grad(y, leaves, grad_out, allow_unused=True))


@pytest.mark.parametrize("seed", range(40))
def test_random_shapes_chunks_and_activations_equal_torch_in_float64(seed):
    case = _case(random.Random(seed))
    y, grads = _run(case, chunked=True)
    want, wanted = _run(case, chunked=False)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    assert len(grads) == len(wanted)
    for got, ref in zip(grads, wanted):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_float32_within_reassociation(seed):
    case = _case(random.Random(1000 + seed), torch.float32)
    y, grads = _run(case, chunked=True)
    want, wanted = _run(case, chunked=False)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    for got, ref in zip(grads, wanted):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("gated", [False, True])
def test_bfloat16_is_no_further_from_float64_than_eager_bfloat16(activation, gated):
    """bf16 inputs: each chunk runs eager's bf16 ops; the weights' gradients accumulate over
    chunks in fp32. Against an fp64 reference, the split may not be further than twice eager
    bf16's own error (and every gradient keeps its dtype)."""
    g = torch.Generator().manual_seed(0)
    full = dict(x=torch.randn(3, 40, 32, generator=g, dtype=torch.float64),
                up_weight=torch.randn(96, 32, generator=g, dtype=torch.float64) / 6,
                up_bias=torch.randn(96, generator=g, dtype=torch.float64),
                gate_weight=(torch.randn(96, 32, generator=g, dtype=torch.float64) / 6
                             if gated else None),
                gate_bias=None,
                down_weight=torch.randn(32, 96, generator=g, dtype=torch.float64) / 10,
                down_bias=torch.randn(32, generator=g, dtype=torch.float64))
    grad_out = torch.randn(3, 40, 32, generator=g, dtype=torch.float64)

    def run(dtype: torch.dtype, chunks: int | None) -> list[torch.Tensor]:
        args = [t.to(dtype).requires_grad_() if t is not None else None
                for t in full.values()]
        y = (reference_mlp(*args, activation) if chunks is None
             else token_mlp(*args, activation, chunks))
        leaves = [a for a in args if a is not None]
        grads = torch.autograd.grad(y, leaves, grad_out.to(dtype))
        assert all(gr.dtype == dtype for gr in grads)
        return [y.detach(), *grads]

    exact = run(torch.float64, None)
    eager = run(torch.bfloat16, None)
    split = run(torch.bfloat16, 4)
    for name, want, e, s in zip(["y", *(k for k, v in full.items() if v is not None)], exact,
                                eager, split):
        eager_error = float((e.double() - want).abs().max())
        split_error = float((s.double() - want).abs().max())
        assert split_error <= 2 * eager_error + 1e-3 * float(want.abs().max()), (
            name, split_error, eager_error)


def test_a_non_contiguous_x_and_a_gradient_of_zero_tokens():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(5, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    x = base.transpose(0, 1)  # [4, 5, 6], not contiguous
    w = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
         for s in ((10, 6), (10, 6), (3, 10))]
    y = token_mlp(x, w[0], None, w[1], None, w[2], None, "silu", 3)
    want = reference_mlp(x, w[0], None, w[1], None, w[2], None, "silu")
    torch.testing.assert_close(y, want)
    got = torch.autograd.grad(y.sum(), [base, *w])
    for a, b in zip(got, torch.autograd.grad(want.sum(), [base, *w])):
        torch.testing.assert_close(a, b)
    empty = torch.zeros(0, 6, dtype=torch.float64, requires_grad=True)
    y = token_mlp(empty, w[0], None, None, None, w[2], None, "relu", 2)
    assert y.shape == (0, 3)
    grads = torch.autograd.grad(y.sum(), [empty, w[0], w[2]])
    assert grads[0].shape == (0, 6) and all(float(gr.abs().sum()) == 0 for gr in grads[1:])


@pytest.mark.parametrize("gated", [False, True])
def test_the_ops_pass_torch_library_opcheck(gated):
    g = torch.Generator().manual_seed(0)

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, requires_grad=True)

    args = (make(2, 5, 4), make(8, 4), make(8), make(8, 4) if gated else None,
            make(8) if gated else None, make(3, 8), make(3), "gelu_tanh", 3)
    torch.library.opcheck(torch.ops.aot_partition.token_mlp.default, args)
    grad = torch.randn(2, 5, 3, generator=g)
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(torch.ops.aot_partition.token_mlp_backward.default, (grad, *detached))


@pytest.mark.parametrize("change, message", [
    (dict(chunks=0), "chunks must be at least 1, got 0"),
    (dict(activation="tanh"), "activation 'tanh': valid are relu, silu, gelu, gelu_tanh"),
    (dict(gate_bias=torch.zeros(8)), "a gate bias without a gate weight"),
    (dict(up_weight=torch.zeros(8, 5)), "shapes do not agree"),
    (dict(down_weight=torch.zeros(3, 7)), "shapes do not agree"),
    (dict(up_bias=torch.zeros(7)), "shapes do not agree"),
    (dict(down_weight=torch.zeros(3, 8, dtype=torch.float64)),
     "must share one dtype, got \\['torch.float32', 'torch.float64'\\]"),
    (dict(up_weight=torch.zeros(8)), "token_mlp takes x \\[..., dim\\], up_weight \\[hidden, dim\\]"),
])
def test_bad_arguments_are_named(change, message):
    args = dict(x=torch.randn(6, 4), up_weight=torch.randn(8, 4), up_bias=None,
                gate_weight=None, gate_bias=None, down_weight=torch.randn(3, 8), down_bias=None,
                activation="silu", chunks=2)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        token_mlp(*args.values())


@pytest.mark.parametrize("gated", [False, True])
def test_flop_counter_counts_the_matmuls_and_the_recompute(gated):
    """FlopCounterMode (and with it the roofline) sees the split's matmuls: the forward as
    eager's; the backward eager's two per projection plus the input projections again."""
    from torch.utils.flop_counter import FlopCounterMode

    tokens, dim, hidden = 64, 16, 48

    def count(split: bool) -> tuple[int, int]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, dim, generator=g, requires_grad=True)
        up = torch.randn(hidden, dim, generator=g, requires_grad=True)
        gate = torch.randn(hidden, dim, generator=g, requires_grad=True) if gated else None
        down = torch.randn(dim, hidden, generator=g, requires_grad=True)
        with FlopCounterMode(display=False) as mode:
            y = (token_mlp(x, up, None, gate, None, down, None, "silu", 4) if split
                 else reference_mlp(x, up, None, gate, None, down, None, "silu"))
        forward = mode.get_total_flops()
        with FlopCounterMode(display=False) as mode:
            y.sum().backward()
        return forward, mode.get_total_flops()

    projection = 2 * tokens * dim * hidden
    inputs = 2 if gated else 1
    eager, split = count(False), count(True)
    assert eager[0] == split[0] == (inputs + 1) * projection
    assert eager[1] == 2 * eager[0]
    assert split[1] == eager[1] + inputs * projection


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_the_scratch_known_from_the_shapes_matches_the_profiler(activation, gated, backward):
    """``workspace_bytes`` (used beyond 256 MiB and on fake tensors, where nothing can run)
    against the profiler's peak-minus-end of a real fp32 call, within 3%."""
    from aot_partition.memory_models.simulator import _measure_cpu_profiler

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 64, generator=g)
    args = (x, torch.randn(256, 64, generator=g), torch.randn(256, generator=g),
            torch.randn(256, 64, generator=g) if gated else None,
            torch.randn(256, generator=g) if gated else None, torch.randn(64, 256, generator=g),
            torch.randn(64, generator=g), activation, 4)
    op = torch.ops.aot_partition.token_mlp.default
    if backward:
        op = torch.ops.aot_partition.token_mlp_backward.default
        args = (torch.randn(1024, 64, generator=g), *args)
    op(*args)
    measured = _measure_cpu_profiler(lambda: op(*args), "cpu")
    scratch = measured.peak_bytes - measured.end_bytes
    assert abs(workspace_bytes(op, args) - scratch) <= 0.03 * scratch, (
        scratch, workspace_bytes(op, args))


def test_the_memory_model_and_the_roofline_know_the_ops():
    """On fake (meta) values the scratch comes from the shapes; the roofline's bytes include the
    passes over each chunk's intermediates."""
    from aot_partition.costs.roofline import bytes_moved
    from aot_partition.memory_models.simulator import profiled_workspace

    op = torch.ops.aot_partition.token_mlp_backward.default
    values = dict(go=torch.empty(4096, 64, device="meta"), x=torch.empty(4096, 64, device="meta"),
                  up=torch.empty(256, 64, device="meta"), gate=torch.empty(256, 64, device="meta"),
                  down=torch.empty(64, 256, device="meta"))
    graph = torch.fx.Graph()
    nodes = {}
    for name, value in values.items():
        nodes[name] = graph.placeholder(name)
        nodes[name].meta["val"] = value
    args = (nodes["go"], nodes["x"], nodes["up"], None, nodes["gate"], None, nodes["down"], None,
            "silu", 8)
    call = graph.call_function(op, args)
    call.meta["val"] = tuple(torch.empty(s, device="meta") for s in
                             ((4096, 64), (256, 64), (0,), (256, 64), (0,), (64, 256), (0,)))
    real_args = (values["go"], values["x"], values["up"], None, values["gate"], None,
                 values["down"], None, "silu", 8)
    assert profiled_workspace(call) == workspace_bytes(op, real_args) == 5 * 512 * 256 * 4
    outside = sum(v.numel() * 4 for v in values.values()) + sum(
        v.numel() * 4 for v in call.meta["val"])
    assert bytes_moved(call) == outside + 17 * 4096 * 256 * 4
