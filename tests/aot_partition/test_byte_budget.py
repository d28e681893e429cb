"""Activation-memory budgets in bytes: ample caps change nothing, caps hold, monotone, clear
errors, and gradients equal eager's."""

from __future__ import annotations

import pytest
from aot_config import functorch as functorch_config
from aot_partition import explain_partition, min_cut_rematerialization_partition
from aot_partition.budget.candidates import CutCandidate
from aot_partition.budget.caps import choose_candidate
from aot_partition.config import PartitionConfig
from aot_partition.errors import UnreachableMemoryBudgetError
from aot_partition.fx.sizes import saved_activation_bytes
from aot_partition.partitioners import partition_with_report
from zoo import assert_matches_eager, make_case


@pytest.fixture(scope="module")
def gpt(capture):
    case = make_case("gpt")
    return capture(case.module, *case.inputs)


def _partition(joint, cap):
    """(forward's saved bytes, report) under a byte cap."""
    fw, _, report = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                          memory_budget_bytes=cap)
    return saved_activation_bytes(fw, joint.num_fwd_outputs), report


@pytest.fixture(scope="module")
def dropout(capture):
    case = make_case("dropout")
    return capture(case.module, *case.inputs)


def _least(joint):
    """The least a cap reaches: the least reachable measure when cap 0 is unreachable (RNG
    states, a dropout mask), else what cap 0 saves (the inputs-only cut keeps nothing new
    alive: inputs cost nothing in the one measure)."""
    try:
        return _partition(joint, 0)[0]
    except UnreachableMemoryBudgetError as error:
        return error.least


def _saved_names(report):
    return [d.name for d in report.saved]


def test_ample_cap_gives_the_full_budget_answer(gpt):
    full_bytes, full = _partition(gpt, None)
    assert full.memory_budget_bytes is None and full.activation_bytes is None
    for cap in (full_bytes, full_bytes + 1, 10**12):
        nbytes, report = _partition(gpt, cap)
        assert nbytes == full_bytes
        assert _saved_names(report) == _saved_names(full)
        assert report.memory_budget_bytes == cap and report.activation_bytes == full_bytes


def test_cap_between_holds_and_counts_what_the_forward_saves(gpt):
    full_bytes, _ = _partition(gpt, None)
    least = _least(gpt)
    assert least < full_bytes
    cap = (least + full_bytes) // 2
    nbytes, report = _partition(gpt, cap)
    assert least <= nbytes <= cap
    # The measure is the forward's saved bytes (no parameter is static-lifetime here).
    assert report.activation_bytes == nbytes == report.saved_bytes


@pytest.mark.slow
def test_saved_bytes_never_grow_as_the_cap_falls(gpt):
    full_bytes, _ = _partition(gpt, None)
    least = _least(gpt)
    caps = [full_bytes - (full_bytes - least) * i // 12 for i in range(13)]
    answers = [_partition(gpt, cap) for cap in caps]
    sizes = [nbytes for nbytes, _ in answers]
    assert sizes == sorted(sizes, reverse=True), sizes
    assert all(nbytes <= cap for nbytes, cap in zip(sizes, caps))
    assert sizes[0] == full_bytes and sizes[-1] == least
    # A higher cap's answer that fits a lower cap is that cap's answer too.
    for (high_bytes, high), cap, (_, low) in zip(answers, caps[1:], answers[1:]):
        if high_bytes <= cap:
            assert _saved_names(low) == _saved_names(high)


def test_cap_zero_is_reachable_when_the_inputs_alone_suffice(gpt):
    # gpt's inputs-only cut saves nothing beyond the inputs (they live anyway).
    nbytes, report = _partition(gpt, 0)
    assert nbytes == report.saved_bytes == report.activation_bytes == 0


def test_unreachable_cap_names_the_cap_and_the_least(dropout):
    least = _least(dropout)
    assert least > 0  # dropout keeps an RNG state or its mask
    with pytest.raises(UnreachableMemoryBudgetError) as info:
        explain_partition(dropout.module, dropout.inputs,
                          num_fwd_outputs=dropout.num_fwd_outputs, memory_budget_bytes=least - 1)
    assert str(info.value) == (
        f"activation memory budget {least - 1} bytes is unreachable: the least this graph "
        f"can save is {least} bytes ({info.value.least_label})")
    assert isinstance(info.value, ValueError)
    assert (info.value.cap, info.value.least) == (least - 1, least)
    assert _partition(dropout, least)[0] == least


@pytest.mark.parametrize("cap", [-1, 1.5, True])
def test_a_cap_that_is_not_a_byte_count_is_a_value_error(gpt, cap):
    with pytest.raises(ValueError, match=f"int >= 0; got {cap!r}"):
        _partition(gpt, cap)


def test_bytes_win_over_the_fraction_and_explicit_config(gpt):
    full_bytes, _ = _partition(gpt, None)
    least = _least(gpt)
    with functorch_config.patch(activation_memory_budget=0.0):
        # The byte cap, ample, overrides the fraction 0.0.
        assert _partition(gpt, full_bytes)[0] == full_bytes
    fw, _, report = partition_with_report(
        gpt.fresh(), num_fwd_outputs=gpt.num_fwd_outputs,
        config=PartitionConfig(memory_budget_bytes=least))
    assert saved_activation_bytes(fw, gpt.num_fwd_outputs) == least
    assert report.format().startswith(f"saved-bytes cap {least} bytes, solver ")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "llama", "dropout"])
def test_flag_cap_matches_eager(name, capture, aot_with):
    case = make_case(name)
    # The joint assert_matches_eager compiles: its float inputs want gradients too.
    joint = capture(case.module, *(t.clone().requires_grad_(t.is_floating_point())
                                  for t in case.inputs))
    full_bytes, _ = _partition(joint, None)
    least = _least(joint)
    for cap in sorted({least, (least + full_bytes) // 2}):
        with functorch_config.patch(activation_memory_budget_bytes=cap):
            assert_matches_eager(make_case(name), aot_with(min_cut_rematerialization_partition))
            assert _partition(joint, None)[0] <= cap


def _candidate(label, rank, runtime):
    return CutCandidate(label, rank, (), (), frozenset(), runtime)


def test_choose_candidate_takes_any_measure():
    # The measure is pluggable (saved bytes now; a simulated peak later).
    candidates = [_candidate("runtime-optimal", 0, 0.0), _candidate("a", 1, 0.0),
                  _candidate("b", 2, 5.0), _candidate("c", 3, 5.0), _candidate("d", 4, 9.0)]
    peak = {"runtime-optimal": 100, "a": 80, "b": 60, "c": 50, "d": 40}

    def measure(c):
        return peak[c.label]

    chosen = [choose_candidate(candidates, cap, measure).label for cap in range(100, 39, -1)]
    assert chosen[0] == "runtime-optimal"
    assert chosen[100 - 80] == "a"
    assert chosen[100 - 60] == "c"  # equal runtimes: the smaller measure
    assert chosen[-1] == "d"
    measured = [peak[label] for label in chosen]
    assert measured == sorted(measured, reverse=True)
    with pytest.raises(UnreachableMemoryBudgetError,
                       match=r"^activation memory peak 39 bytes is unreachable: the least this "
                             r"graph can reach is 40 bytes \(d\)$"):
        choose_candidate(candidates, 39, measure, what="activation memory peak", verb="reach")
