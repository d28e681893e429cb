"""The floor of a peak cap against torch's own partitioner (issue 50, item 5): on transformers'
GPT-2 called as the Trainer calls it (``model(input_ids=..., labels=...).loss``; issue 50,
item 2's case, made small), the least our pipeline's step can peak at under a cap is never
above what torch's partitioner at ``activation_memory_budget=0.5`` measures on the same step,
and a "0.8 peak" cap compiles, holds as measured, and matches eager. Peaks measured on CPU from
the profiler's allocation events (above what is allocated before the step)."""

from __future__ import annotations

import aot_pipeline
import pytest
import torch
from aot_partition import UnreachableMemoryBudgetError
from aot_partition.memory_models.simulator import measure_peak

transformers = pytest.importorskip("transformers")

VOCAB, EMBD, BATCH, SEQ = 1024, 32, 1, 128


def _model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=EMBD, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(config).train()


def _batch():
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return ids, ids.clone()


def _step_of(model, compiled):
    ids, labels = _batch()

    def step():
        loss = compiled(ids, labels)
        loss.backward()
        return loss

    return step


def _measured(model, compiled):
    """(peak above the step's inputs, loss, gradients) of a warm step."""
    step = _step_of(model, compiled)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        step()
    model.zero_grad(set_to_none=True)
    peak = measure_peak(step).peak_bytes
    model.zero_grad(set_to_none=True)
    loss = step()
    return peak, loss, {n: p.grad for n, p in model.named_parameters()}


def _call(model):
    return lambda ids, labels: model(input_ids=ids, labels=labels).loss


@pytest.fixture(scope="module")
def torch_at_half():
    from torch._functorch import config as functorch_config

    torch._dynamo.reset()
    model = _model()
    with functorch_config.patch(activation_memory_budget=0.5):
        peak, _, _ = _measured(model, torch.compile(_call(model), backend="inductor"))
    torch._dynamo.reset()
    return peak


def test_a_peak_cap_on_gpt2_through_labels_holds_below_torch_at_half(torch_at_half):
    torch._dynamo.reset()
    model = _model()
    compiled = aot_pipeline.compile(_call(model), memory_budget="0.8 peak")
    peak, loss, grads = _measured(model, compiled)
    predicted = compiled.predicted_peak()
    assert len(predicted.graphs) == 1  # labels= is one graph (transformers_logging)
    assert peak <= torch_at_half
    # Eager, from the same weights.
    eager = _model()
    ids, labels = _batch()
    want = eager(input_ids=ids, labels=labels).loss
    want.backward()
    torch.testing.assert_close(loss, want)
    for name, param in eager.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, msg=name)


def test_the_floor_of_a_peak_cap_on_gpt2_is_not_above_torch_at_half(torch_at_half):
    torch._dynamo.reset()
    model = _model()
    # Unsplit: one compile prices every cut (the split, tried otherwise, only lowers it).
    compiled = aot_pipeline.compile(_call(model), memory_budget="1KiB peak", split=False)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - torch.compile wraps it
        _measured(model, compiled)
    error = caught.value
    while error is not None and not isinstance(error, UnreachableMemoryBudgetError):
        error = error.__cause__ or error.__context__
    assert error is not None, caught.value
    # The floor counts the step's inputs (parameters, the batch); the measured peak does not.
    inputs = sum(p.numel() * p.element_size() for p in model.parameters()) \
        + sum(t.numel() * t.element_size() for t in _batch())
    assert error.least - inputs <= torch_at_half
