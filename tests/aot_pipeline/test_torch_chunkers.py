"""Our pipeline beside torch's own chunkers (issue 50, item 2): Inductor's auto_chunker and
``F.linear_cross_entropy`` with ``LinearCrossEntropyOptions`` in user code.

Each step (forward, fp32 cross-entropy, backward) is compared with eager: the loss and every
gradient. The log says which chunker took the LM head."""

from __future__ import annotations

import copy
import logging

import aot_pipeline
import pytest
import torch
import torch.nn.functional as F
from aot_pipeline.models import GPT
from torch._inductor import config as inductor_config

pytestmark = pytest.mark.skipif(not hasattr(inductor_config, "auto_chunker"),
                                reason="Inductor's auto_chunker arrived in torch 2.13")

VOCAB, DIM, TOKENS, BATCH = 8192, 32, 128, 4


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model_and_batch():
    torch.manual_seed(0)
    model = GPT(vocab=VOCAB, dim=DIM, heads=4, layers=1, seq=TOKENS)
    idx = torch.randint(0, VOCAB, (BATCH, TOKENS))
    return model, idx, torch.randint(0, VOCAB, (BATCH, TOKENS))


def _gpt_loss(model):
    def step(idx, targets):
        return F.cross_entropy(model(idx).flatten(0, 1).float(), targets.flatten())
    return step


def _assert_step_matches_eager(make_step, compile_step):
    model, idx, targets = _model_and_batch()
    twin = copy.deepcopy(model)
    expected = make_step(twin)(idx, targets)
    expected.backward()
    loss = compile_step(make_step(model))(idx, targets)
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for (name, param), (_, reference) in zip(model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(param.grad, reference.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _chunkings() -> int:
    from torch._inductor import metrics

    return metrics.num_auto_chunking


def test_auto_chunker_on_runs_exact_and_its_chunks_are_kept(caplog):
    before = _chunkings()
    with inductor_config.patch({"auto_chunker.enable": True}), \
            caplog.at_level(logging.INFO, logger="aot_pipeline"):
        _assert_step_matches_eager(_gpt_loss, lambda step: aot_pipeline.compile(step))
    assert _chunkings() == before + 1  # the chunker ran on the joint we partitioned
    assert "Inductor's auto_chunker chunked this joint (8 chunk calls); our partitioner keeps " \
           "its chunks" in caplog.text


def test_with_the_split_on_the_split_takes_the_head_and_the_chunker_leaves_it(caplog):
    before = _chunkings()
    with inductor_config.patch({"auto_chunker.enable": True}), \
            caplog.at_level(logging.INFO, logger="aot_pipeline"):
        _assert_step_matches_eager(_gpt_loss, lambda step: aot_pipeline.compile(step, split=4))
    assert _chunkings() == before  # one plan: nothing left for the chunker to chunk
    assert ("our split took the LM head and its loss; Inductor's auto_chunker left them (the "
            "chunked loss amplifies nothing)") in caplog.text


def test_with_the_chunker_off_the_log_says_nothing_of_it(caplog):
    with caplog.at_level(logging.INFO, logger="aot_pipeline"):
        _assert_step_matches_eager(_gpt_loss, lambda step: aot_pipeline.compile(step))
    assert "auto_chunker" not in caplog.text


# ---- F.linear_cross_entropy in user code ----------------------------------------------------

def _linear_cross_entropy_loss(model):
    def step(idx, targets):
        x = model.tok(idx) + model.pos[: idx.shape[1]]
        for block in model.blocks:
            x = block(x)
        hidden = model.ln(x).flatten(0, 1)
        return F.linear_cross_entropy(hidden, model.head.weight, targets.flatten(),
                                      linear_bias=model.head.bias,
                                      options=torch.nn.LinearCrossEntropyOptions())
    return step


def _largest_value(graphs) -> int:
    return max(val.numel() for graph in graphs for node in graph.nodes
               if isinstance(val := node.meta.get("val"), torch.Tensor))


def test_linear_cross_entropy_in_user_code_passes_through_exact_and_stays_chunked():
    compiled = {}

    def ours(step):
        compiled["model"] = aot_pipeline.compile(step)
        return compiled["model"]

    _assert_step_matches_eager(_linear_cross_entropy_loss, ours)
    graphs = [graph for part in compiled["model"].partitions for graph in (part.forward.graph,
                                                                           part.backward.graph)]
    # No value of the whole logits' size in either graph: the chunks were not joined.
    assert _largest_value(graphs) < BATCH * TOKENS * VOCAB


def test_the_unchunked_loss_does_hold_the_whole_logits():
    # The opposite case of the check above: the plain loss's graphs have the logits.
    compiled = {}

    def ours(step):
        compiled["model"] = aot_pipeline.compile(step)
        return compiled["model"]

    _assert_step_matches_eager(_gpt_loss, ours)
    graphs = [graph for part in compiled["model"].partitions for graph in (part.forward.graph,
                                                                           part.backward.graph)]
    assert _largest_value(graphs) >= BATCH * TOKENS * VOCAB
