"""An unreachable byte cap behaves one way (issue 27): UnreachableMemoryBudgetError naming the
least reachable size, or, with ``activation_memory_budget_best_effort``, that least cut taken
with a MemoryBudgetBestEffortWarning saying what it saved. Same through ``partition_fn``."""

from __future__ import annotations

import warnings

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import (
    MemoryBudgetBestEffortWarning,
    UnreachableMemoryBudgetError,
    explain_partition,
    min_cut_rematerialization_partition,
)
from aot_partition.config import PartitionConfig
from torch._functorch.aot_autograd import aot_function
from zoo import make_case


@pytest.fixture(scope="module")
def dropout(capture):
    # Its random op keeps an RNG state or a mask whatever the cut: a cap of 1 byte is out of
    # reach (inputs cost nothing, so the inputs-only cut of a graph without one saves 0).
    case = make_case("dropout")
    return capture(case.module, *case.inputs)


def _explain(joint, **kwargs):
    return explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                             **kwargs)


def _least(joint, **caps):
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        _explain(joint, **caps)
    return info.value


def test_without_best_effort_the_error_names_the_least_size(dropout):
    error = _least(dropout, memory_budget_bytes=1)
    assert str(error) == (f"activation memory budget 1 bytes is unreachable: the least this "
                          f"graph can save is {error.least} bytes ({error.least_label})")
    assert error.least > 1


def test_best_effort_takes_the_least_cut_and_says_so(dropout):
    error = _least(dropout, memory_budget_bytes=1)
    config = PartitionConfig.from_flags(best_effort=True)
    with pytest.warns(MemoryBudgetBestEffortWarning) as record:
        report = _explain(dropout, memory_budget_bytes=1, config=config)
    assert [str(w.message) for w in record
            if issubclass(w.category, MemoryBudgetBestEffortWarning)] == [
        f"{error}; best effort (activation_memory_budget_best_effort): took the "
        f"{error.least_label} cut at {error.least} bytes"]
    assert report.activation_bytes == error.least
    assert report.memory_budget_bytes == 1


def test_best_effort_does_not_fire_when_the_cap_is_reachable(dropout):
    least = _least(dropout, memory_budget_bytes=1).least
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemoryBudgetBestEffortWarning)
        report = _explain(dropout, memory_budget_bytes=least,
                          config=PartitionConfig.from_flags(best_effort=True))
    assert report.activation_bytes == least


def test_best_effort_covers_the_peak_cap_too(dropout):
    error = _least(dropout, peak_bytes=1)
    assert str(error).startswith("simulated memory peak cap 1 bytes is unreachable")
    with pytest.warns(MemoryBudgetBestEffortWarning, match=r"^simulated memory peak cap 1 bytes "
                      r"is unreachable: .*; best effort \(activation_memory_budget_best_effort\):"
                      f" took the .* cut at {error.least} bytes$"):
        report = _explain(dropout, peak_bytes=1, config=PartitionConfig.from_flags(best_effort=True))
    assert report.simulated_peak_bytes == error.least


def test_the_flag_reaches_partition_fn():
    def f(x, w):  # dropout: its RNG state or mask keeps the least cut above 1 byte
        return torch.nn.functional.dropout(torch.relu(x @ w), 0.5, training=True).sin().sum()

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)

    def nop(gm, _):
        return gm

    def compiled():
        return aot_function(f, fw_compiler=nop, bw_compiler=nop,
                            partition_fn=min_cut_rematerialization_partition)

    with functorch_config.patch(activation_memory_budget_bytes=1):
        with pytest.raises(UnreachableMemoryBudgetError,
                           match=r"^activation memory budget 1 bytes is unreachable"):
            compiled()(x, w)
        with functorch_config.patch(activation_memory_budget_best_effort=True), \
                pytest.warns(MemoryBudgetBestEffortWarning, match="best effort"):
            torch.manual_seed(0)
            out = compiled()(x, w)
    out.backward()
    expected_x, expected_w = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.manual_seed(0)
    f(expected_x, expected_w).backward()
    torch.testing.assert_close((x.grad, w.grad), (expected_x.grad, expected_w.grad))


def test_the_flag_must_be_a_bool():
    with pytest.raises(ValueError, match=r"activation_memory_budget_best_effort = 'yes' is not "
                                         r"valid: expected bool"):
        functorch_config.activation_memory_budget_best_effort = "yes"
