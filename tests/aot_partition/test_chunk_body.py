"""The chunked cross-entropy's compiled chunk body (aot_partition.split.chunk_body): each chunk's
log-sum-exp, loss and logit gradient fused by Inductor (C++ here), against torch's own
``F.cross_entropy(F.linear(...))`` for the loss and every gradient: ignored (-100) tokens, mean
and sum, label smoothing, with and without a bias, chunk sizes that do not divide the tokens,
fp32 and bf16 weights with the loss in fp32; the body compiled once per shape; a compile that
fails falls back to the eager body, said once; the mode named when bad."""

from __future__ import annotations

import logging

import pytest
import torch
from aot_partition.split import chunk_body as body_module
from aot_partition.split.chunk_body import chunk_body, get_chunk_body, set_chunk_body
from aot_partition.split.chunked_loss import (
    linear_cross_entropy,
    linear_cross_entropy_with_grads,
    reference_linear_cross_entropy,
)

OPS = {"recompute": linear_cross_entropy, "forward_grads": linear_cross_entropy_with_grads}

# Before torch 2.13 the compiled body is refused (on 2.11 it computed wrong gradients): the
# eager body runs, tested by the last test here.
needs_compiled_body = pytest.mark.skipif(not body_module.COMPILED_BODY_SUPPORTED,
                                         reason="the compiled chunk body needs torch >= 2.13")



def _case(tokens=37, vocab=50, dim=8, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, vocab, (tokens,), generator=g)
    target[torch.rand(tokens, generator=g) < 0.3] = -100
    target[0] = 3
    return dict(hidden=torch.randn(tokens, dim, generator=g).to(dtype).requires_grad_(),
                weight=torch.randn(vocab, dim, generator=g).to(dtype).requires_grad_(),
                bias=(torch.randn(vocab, generator=g).to(dtype).requires_grad_()
                      if bias else None),
                target=target)


def _run(case, op, reduction, smoothing, chunks):
    leaves = [case[k] for k in ("hidden", "weight", "bias") if case[k] is not None]
    args = (case["hidden"], case["weight"], case["bias"], case["target"], -100, reduction,
            smoothing)
    if op is None:
        loss = reference_linear_cross_entropy(*args, dtype=torch.float32)
    else:
        loss = op(*args, "float32", chunks)[0]
    return loss, torch.autograd.grad(loss, leaves)


# ignore_index -100 throughout; 37 tokens in 2 (19 + 18), 5 (8 x 4 + 5) and 37 chunks of 1.
@needs_compiled_body
@pytest.mark.parametrize("mode", OPS)
@pytest.mark.parametrize("reduction, smoothing, bias, chunks", [
    ("mean", 0.0, True, 2), ("sum", 0.0, False, 5), ("mean", 0.1, False, 5),
    ("sum", 0.25, True, 37)])
def test_the_compiled_body_equals_torch_in_float32(mode, reduction, smoothing, bias, chunks):
    case = _case(bias=bias)
    with chunk_body("compiled"):
        body_module.clear_cache()
        loss, grads = _run(case, OPS[mode], reduction, smoothing, chunks)
        compiled = [v for v in body_module._cache.values() if v is not None]
    want, wanted = _run(case, None, reduction, smoothing, chunks)
    assert compiled, "no chunk body was compiled"
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, wanted):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@needs_compiled_body
@pytest.mark.parametrize("mode", OPS)
@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_weights_with_the_loss_in_float32_as_close_as_the_eager_body(mode, bias):
    """bf16 projection, fp32 loss: the compiled body's loss and gradients no further from
    fp32 torch than the eager body's (the weight's gradient accumulated in fp32 in both)."""
    case = _case(tokens=40, vocab=64, dim=16, dtype=torch.bfloat16, bias=bias, seed=3)
    exact = {k: (v.detach().double().requires_grad_() if k != "target" and v is not None
                 else v) for k, v in case.items()}
    want_loss, wanted = _run(exact, None, "mean", 0.1, 3)
    errors = {}
    for body in ("eager", "compiled"):
        with chunk_body(body):
            loss, grads = _run(case, OPS[mode], "mean", 0.1, 3)
        assert loss.dtype == torch.float32
        errors[body] = max([abs(float(loss.detach()) - float(want_loss.detach()))]
                           + [float((g.double() - w).abs().max()) for g, w in zip(grads, wanted)])
    assert errors["compiled"] <= 2 * errors["eager"] + 1e-3, errors


@needs_compiled_body
def test_every_token_ignored_gives_nan_with_mean_in_the_compiled_body_too():
    case = _case()
    case["target"][:] = -100
    with chunk_body("compiled"):
        loss = linear_cross_entropy_with_grads(case["hidden"], case["weight"], None,
                                               case["target"], -100, "mean", 0.0, "float32",
                                               4)[0]
    assert torch.isnan(loss)


@needs_compiled_body
def test_each_shape_compiles_once_and_odd_chunks_add_one_shape():
    case = _case(tokens=37)
    with chunk_body("compiled"):
        body_module.clear_cache()
        for _ in range(2):
            _run(case, linear_cross_entropy_with_grads, "mean", 0.0, 5)
        kinds = [key[0] for key in body_module._cache]
    assert kinds == ["with_grads", "with_grads"]  # chunks of 8 and the last of 5


@needs_compiled_body
def test_a_compile_that_fails_runs_the_eager_body_and_says_so(monkeypatch, caplog):
    import torch._inductor

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch._inductor, "compile", broken)
    case = _case()
    with chunk_body("compiled"), caplog.at_level(logging.WARNING, "aot_partition"):
        body_module.clear_cache()
        loss, grads = _run(case, linear_cross_entropy_with_grads, "mean", 0.0, 2)
        _run(case, linear_cross_entropy_with_grads, "mean", 0.0, 2)
    want, wanted = _run(case, None, "mean", 0.0, 2)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, wanted):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    messages = [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()]
    assert len(messages) == 2  # once for each shape (19 and 18 tokens), not once a call
    assert "RuntimeError: no C++ compiler" in messages[0] and "eager body" in messages[0]
    body_module.clear_cache()


@needs_compiled_body
def test_auto_compiles_only_chunks_of_1_mib_of_fp32_logits_or_more():
    assert get_chunk_body() == "auto"
    assert not body_module.planned("cpu", 63, 4096)       # under 2**18 logits: eager
    assert body_module.planned("cpu", 64, 4096)
    assert not body_module.planned("meta", 1024, 32768)
    with chunk_body("eager"):
        assert not body_module.planned("cpu", 1024, 32768)
    with chunk_body("compiled"):
        assert body_module.planned("cpu", 1, 2)


def test_a_bad_mode_is_named():
    with pytest.raises(ValueError, match=r"chunk body 'fast' \(set_chunk_body\): valid are "
                                         r"auto, compiled, eager"):
        set_chunk_body("fast")
    assert get_chunk_body() == "auto"


@pytest.mark.skipif(body_module.COMPILED_BODY_SUPPORTED, reason="this torch compiles the body")
def test_before_torch_2_13_the_eager_body_runs_and_compiled_is_refused_aloud(caplog):
    body_module._warned_unsupported = False
    with chunk_body("compiled"), caplog.at_level(logging.WARNING, "aot_partition"):
        assert not body_module.planned("cpu", 4096, 32768)
        assert not body_module.planned("cpu", 4096, 32768)
    said = [r.getMessage() for r in caplog.records if "refused on torch" in r.getMessage()]
    assert len(said) == 1 and "needs torch >= 2.13" in said[0]
