"""The predicted peak of one step across its graphs (issue 50, item 5): ``CompiledModel.
predicted_peak()`` against the peak measured on CPU (the profiler's allocation events), the
loss and backward inside the step, with and without a graph break."""

from __future__ import annotations

import logging

import aot_pipeline
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from aot_partition.memory_models.simulator import measure_peak

DIM, VOCAB, TOKENS = 128, 1024, 256


class TwoStages(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.second = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor, graph_break: bool) -> torch.Tensor:
        h = self.first(x)
        if graph_break:
            torch._dynamo.graph_break()
        return F.cross_entropy(self.head(self.second(h)), y)


def _measured_and_predicted(graph_break: bool):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoStages()
    x, y = torch.randn(TOKENS, DIM), torch.randint(0, VOCAB, (TOKENS,))
    compiled = aot_pipeline.compile(lambda x, y: model(x, y, graph_break))

    def step():
        compiled(x, y).backward()

    for _ in range(2):  # compile, then one step with every buffer warm
        model.zero_grad(set_to_none=True)
        step()
    model.zero_grad(set_to_none=True)
    measured = measure_peak(step).peak_bytes
    return compiled, measured, compiled.predicted_peak()


def test_one_graph_the_prediction_is_the_measured_peak(caplog):
    with caplog.at_level(logging.INFO, logger="aot_pipeline"):
        compiled, measured, predicted = _measured_and_predicted(graph_break=False)
    assert len(predicted.graphs) == 1 and predicted.exact_model
    assert abs(predicted.above_inputs_bytes - measured) <= 0.001 * measured
    inputs = predicted.graphs[0].input_bytes
    assert predicted.peak_bytes == predicted.above_inputs_bytes + inputs
    assert "predicted step peak" in caplog.text and "(inductor)" in caplog.text
    assert compiled.predicted_peak() is predicted  # priced once


def test_across_a_graph_break_the_step_is_bounded_from_above_closely():
    _, measured, predicted = _measured_and_predicted(graph_break=True)
    assert len(predicted.graphs) == 2 and not predicted.exact_model
    # Each graph alone is below the step: the step's number is not one graph's.
    assert max(g.above_inputs for g in predicted.graphs) < measured
    assert measured <= predicted.above_inputs_bytes <= 1.05 * measured
    assert "an upper bound across graph breaks" in predicted.describe()


def test_before_the_first_step_it_says_what_to_do():
    compiled = aot_pipeline.compile(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"^no partition recorded yet: run the compiled step "
                                         r"once \(with record_partitions=True, the default\) "
                                         r"before predicted_peak\(\)$"):
        compiled.predicted_peak()
