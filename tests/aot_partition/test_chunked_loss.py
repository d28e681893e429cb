"""The chunked LM head and cross-entropy ops (aot_partition.split.chunked_loss) against torch's own
``F.cross_entropy(F.linear(...))``: loss and every gradient, over random shapes, chunk counts,
ignore masks, reductions, label smoothing, with and without a bias; and their edges."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from aot_partition.split.chunk_body import COMPILED_BODY_SUPPORTED, chunk_body
from aot_partition.split.chunked_loss import (
    dtype_name,
    linear_cross_entropy,
    linear_cross_entropy_with_grads,
    reference_linear_cross_entropy,
)

# The two ways of making the gradients: logits recomputed in the backward, or made in the
# forward (the backward scales them).
OPS = {"recompute": linear_cross_entropy, "forward_grads": linear_cross_entropy_with_grads}


def _case(rng: random.Random, dtype: torch.dtype) -> dict:
    tokens, vocab, dim = rng.randint(1, 70), rng.randint(2, 60), rng.randint(1, 24)
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    target = torch.randint(0, vocab, (tokens,), generator=g)
    ignored = torch.rand(tokens, generator=g) < rng.choice([0.0, 0.3, 0.8])
    ignore_index = rng.choice([-100, -1, vocab + 7])
    target[ignored] = ignore_index
    if not (target != ignore_index).any():
        target[0] = 0
    return dict(
        hidden=torch.randn(tokens, dim, generator=g, dtype=dtype).requires_grad_(),
        weight=torch.randn(vocab, dim, generator=g, dtype=dtype).requires_grad_(),
        bias=(torch.randn(vocab, generator=g, dtype=dtype).requires_grad_()
              if rng.random() < 0.5 else None),
        target=target, ignore_index=ignore_index,
        reduction=rng.choice(["mean", "sum"]),
        label_smoothing=rng.choice([0.0, 0.0, 0.1, 0.25]),
        chunks=rng.choice([1, 2, 3, 5, 8, tokens, tokens + 3]))


def _loss_and_grads(case: dict, chunked: str | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [case[k] for k in ("hidden", "weight", "bias") if case[k] is not None]
    if chunked:
        loss = OPS[chunked](
            case["hidden"], case["weight"], case["bias"], case["target"], case["ignore_index"],
            case["reduction"], case["label_smoothing"], dtype_name(case["hidden"].dtype),
            case["chunks"])[0]
    else:
        loss = reference_linear_cross_entropy(
            case["hidden"], case["weight"], case["bias"], case["target"], case["ignore_index"],
            case["reduction"], case["label_smoothing"])
    return loss, list(torch.autograd.grad(loss, leaves))


@pytest.mark.parametrize("mode", OPS)
@pytest.mark.parametrize("seed", range(30))
def test_random_shapes_chunks_and_ignore_masks_equal_torch_in_float64(seed, mode):
    case = _case(random.Random(seed), torch.float64)
    loss, grads = _loss_and_grads(case, chunked=mode)
    ref_loss, ref_grads = _loss_and_grads(case, chunked=None)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", OPS)
@pytest.mark.parametrize("seed", range(8))
def test_float32_within_reassociation(seed, mode):
    case = _case(random.Random(100 + seed), torch.float32)
    loss, grads = _loss_and_grads(case, chunked=mode)
    ref_loss, ref_grads = _loss_and_grads(case, chunked=None)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", OPS)
def test_bfloat16_logits_upcast_to_float32_as_models_do(mode):
    """bf16 projection, fp32 loss (``logits.float()``): the gradient of the logits is cast
    back to bf16 before the projection's backward, as eager's; the weight's gradient is
    accumulated over chunks in fp32 (eager's one matmul accumulates in fp32 too)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(96, 32, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(200, 32, generator=g).bfloat16().requires_grad_()
    target = torch.randint(0, 200, (96,), generator=g)
    target[:10] = -100
    loss = OPS[mode](hidden, weight, None, target, -100, "mean", 0.0, "float32", 4)[0]
    ref = F.cross_entropy(F.linear(hidden, weight).float(), target)
    assert loss.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(loss, [hidden, weight])
    want = torch.autograd.grad(ref, [hidden, weight])
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)


def test_every_token_ignored_gives_nan_with_mean_as_torch_does():
    hidden, weight = torch.randn(4, 3), torch.randn(5, 3)
    target = torch.full((4,), -100)
    loss, _ = linear_cross_entropy(hidden, weight, None, target, -100, "mean", 0.0, "float32", 2)
    ref = F.cross_entropy(F.linear(hidden, weight), target)
    assert torch.isnan(ref) and torch.isnan(loss)
    summed, _ = linear_cross_entropy(hidden, weight, None, target, -100, "sum", 0.0, "float32", 2)
    assert float(summed) == 0.0 == float(F.cross_entropy(F.linear(hidden, weight), target,
                                                         reduction="sum"))


def test_a_gradient_of_the_loss_other_than_one_scales_the_forward_made_gradients():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(12, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 9, (12,), generator=g)
    loss = linear_cross_entropy_with_grads(hidden, weight, None, target, -100, "mean", 0.0,
                                           "float64", 5)[0]
    got = torch.autograd.grad(3.5 * loss, [hidden, weight])
    want = torch.autograd.grad(3.5 * F.cross_entropy(F.linear(hidden, weight), target),
                               [hidden, weight])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", [torch.ops.aot_partition.linear_cross_entropy.default,
                                torch.ops.aot_partition.linear_cross_entropy_with_grads.default])
def test_the_ops_pass_torch_library_opcheck(op):
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(10, 4, generator=g, requires_grad=True),
            torch.randn(7, 4, generator=g, requires_grad=True),
            torch.randn(7, generator=g, requires_grad=True),
            torch.randint(0, 7, (10,), generator=g), -100, "mean", 0.1, "float32", 3)
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(reduction="none"), "reduction 'none': valid are mean, sum"),
    (dict(chunks=0), "chunks must be at least 1, got 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    settings = dict(reduction="mean", chunks=2)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), None, torch.zeros(4).long(),
                             -100, settings["reduction"], 0.0, "float32", settings["chunks"])


def test_an_unsupported_compute_dtype_is_named():
    with pytest.raises(ValueError, match="no chunked cross-entropy in torch.int32; valid: "
                                         "float32, float64, bfloat16, float16"):
        dtype_name(torch.int32)


def test_flop_counter_counts_the_projections():
    """FlopCounterMode (and with it the roofline) sees the split's matmuls: gradients made in
    the forward count the unsplit linear's three matmuls; recomputing the logits, one more."""
    from torch.utils.flop_counter import FlopCounterMode

    def count(fn):
        hidden = torch.randn(64, 16, requires_grad=True)
        weight = torch.randn(100, 16, requires_grad=True)
        target = torch.randint(0, 100, (64,))
        with FlopCounterMode(display=False) as mode:
            fn(hidden, weight, target).backward()
        return mode.get_total_flops()

    projection = 2 * 64 * 16 * 100
    unsplit = count(lambda h, w, t: F.cross_entropy(F.linear(h, w), t))
    counted = {name: count(lambda h, w, t, op=op: op(h, w, None, t, -100, "mean", 0.0,
                                                      "float32", 4)[0])
               for name, op in OPS.items()}
    assert unsplit == counted["forward_grads"] == 3 * projection
    assert counted["recompute"] == 4 * projection


@pytest.mark.parametrize("body", ["eager", pytest.param("compiled", marks=pytest.mark.skipif(
    not COMPILED_BODY_SUPPORTED, reason="the compiled chunk body needs torch >= 2.13"))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["recompute", "backward", "forward_grads"])
def test_the_scratch_known_from_the_shapes_matches_the_profiler(dtype, name, body):
    """``workspace_bytes`` (used beyond 256 MiB, on fake tensors, where nothing can run, and
    for the compiled chunk body) against the profiler's peak-minus-end of a real call, within
    3%, for either chunk body."""
    from aot_partition.memory_models.simulator import _measure_cpu_profiler
    from aot_partition.split.chunked_loss import workspace_bytes

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(512, 64, generator=g).to(dtype)
    weight = torch.randn(4096, 64, generator=g).to(dtype)
    bias = torch.randn(4096, generator=g).to(dtype)
    target = torch.randint(0, 4096, (512,), generator=g)
    if name == "backward":
        op = torch.ops.aot_partition.linear_cross_entropy_backward.default
        args = (torch.tensor(1.0), hidden, weight, bias, target, torch.randn(512), -100, "mean",
                0.0, 4)
    else:
        op = (torch.ops.aot_partition.linear_cross_entropy.default if name == "recompute"
              else torch.ops.aot_partition.linear_cross_entropy_with_grads.default)
        args = (hidden, weight, bias, target, -100, "mean", 0.0, "float32", 4)
    with chunk_body(body):
        op(*args)
        measured = _measure_cpu_profiler(lambda: op(*args), "cpu")
        scratch = measured.peak_bytes - measured.end_bytes
        estimate = workspace_bytes(op, args)
    assert abs(estimate - scratch) <= 0.03 * scratch, (scratch, estimate)


@pytest.mark.parametrize("body, passes", [("eager", 12), pytest.param(
    "compiled", 5, marks=pytest.mark.skipif(not COMPILED_BODY_SUPPORTED,
                                            reason="the compiled chunk body needs torch >= 2.13"))])
def test_the_roofline_prices_the_passes_over_each_chunk(body, passes):
    """A split op moves its chunks' logits several times (12 passes in the eager body, 5 in
    the compiled one) and the weight once or more a chunk: the roofline's bytes include both
    (its inputs and outputs alone would miss most of its memory time, and would price every
    chunk count alike)."""
    from aot_partition.costs.roofline import bytes_moved

    op = torch.ops.aot_partition.linear_cross_entropy_with_grads.default
    h, w, t = torch.randn(512, 64), torch.randn(4096, 64), torch.randint(0, 4096, (512,))
    graph = torch.fx.Graph()
    inputs = [graph.placeholder(name) for name in ("h", "w", "t")]
    for node, value in zip(inputs, (h, w, t)):
        node.meta["val"] = value
    call = graph.call_function(op, (inputs[0], inputs[1], None, inputs[2], -100, "mean", 0.0,
                                    "float32", 4))
    call.meta["val"] = op(h, w, None, t, -100, "mean", 0.0, "float32", 4)
    outside = sum(x.numel() * x.element_size() for x in (h, w, t, *call.meta["val"]))
    # fp32 weight, 4 chunks: each reads it twice, writes its product, reads the product and
    # the sum and writes the sum
    per_chunk = 4096 * 64 * (2 * 4 + 4 + 3 * 4)
    with chunk_body(body):
        assert bytes_moved(call) == outside + passes * 512 * 4096 * 4 + 4 * per_chunk
        # more chunks cost more: the weight-sized traffic is repeated by every chunk
        call.args = (*call.args[:8], 16)
        assert bytes_moved(call) == outside + passes * 512 * 4096 * 4 + 16 * per_chunk


def _partitioned_step(budget, vocab=256):
    """Two MLP layers (512 tokens, dim 64, width 256) and the chunked head (vocab 256): the
    layers' activations are most of the saved bytes, the op's gradients a sixth; partitioned
    by ours at ``budget``. The op's targets in the backward graph."""
    from aot_config import functorch as flags
    from aot_partition import min_cut_rematerialization_partition
    from functorch.compile import aot_function, make_boxed_func

    torch.manual_seed(0)
    hidden = torch.randn(512, 64, requires_grad=True)
    weights = [torch.randn(*shape, requires_grad=True) * 0.1
               for shape in ((64, 256), (256, 64), (64, 256), (256, 64))]
    head = torch.randn(vocab, 64, requires_grad=True)
    target = torch.randint(0, vocab, (512,))
    graphs = {}

    def compiler(name):
        def compile_graph(gm, _inputs):
            graphs[name] = gm
            return make_boxed_func(gm)
        return compile_graph

    def step(hidden, up1, down1, up2, down2, head, target):
        x = hidden + torch.tanh(hidden @ up1) @ down1
        x = x + torch.tanh(x @ up2) @ down2
        return torch.ops.aot_partition.linear_cross_entropy_with_grads(
            x, head, None, target, -100, "mean", 0.0, "float32", 4)[0]

    with flags.patch(activation_memory_budget=budget):
        loss = aot_function(step, fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                            partition_fn=min_cut_rematerialization_partition)(
            hidden, *weights, head, target)
    loss.backward()
    return [str(n.target) for n in graphs["bw"].graph.nodes
            if "aot_partition" in str(n.target)]


def test_the_partitioner_prices_recomputing_the_chunked_op_like_a_matmul():
    """The op runs the head's three matmuls. At budget 0.2 the cut recomputes the cheap layers,
    not the op: unbanned, the aggressive cut recomputed it for free (here, and at GPT-2 size:
    +11.5 ms on a 21 ms step, simulated). With the budget at 0 (recompute everything that can
    be) it is released like a matmul."""
    assert _partitioned_step(0.2) == []
    assert _partitioned_step(0.0) == ["aot_partition.linear_cross_entropy_with_grads.default"]
