"""Knapsack solvers: exact against brute force, DP against torch's, greedy within capacity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from aot_partition.knapsack import (
    QUANTIZATION_SCALE,
    dp_knapsack,
    dp_knapsack_hirschberg,
    get_knapsack_solver,
    greedy_knapsack,
    ilp_knapsack,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._functorch._activation_checkpointing import knapsack as torch_knapsack

weights = st.lists(st.floats(0.0, 0.5, allow_nan=False, allow_subnormal=False), min_size=1,
                   max_size=9)


def brute_force(memory, runtimes, max_memory):
    best = 0.0
    for mask in itertools.product((0, 1), repeat=len(memory)):
        if sum(m for m, b in zip(memory, mask) if b) <= max_memory:
            best = max(best, sum(r for r, b in zip(runtimes, mask) if b))
    return best


def check_partition(result, n, memory, max_memory, slack=0.0):
    value, saved, recompute = result
    assert sorted(saved + recompute) == list(range(n))
    assert saved == sorted(saved)
    assert sum(memory[i] for i in saved) <= max_memory + slack + 1e-9
    return value


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_ilp_equals_brute_force(data):
    memory = data.draw(weights)
    runtimes = data.draw(st.lists(st.floats(0.0, 100.0), min_size=len(memory),
                                  max_size=len(memory)))
    max_memory = data.draw(st.floats(0.0, 1.5))
    result = ilp_knapsack(memory, runtimes, max_memory)
    value = check_partition(result, len(memory), memory, max_memory)
    assert value == pytest.approx(brute_force(memory, runtimes, max_memory), rel=1e-6, abs=1e-6)
    assert value == pytest.approx(sum(runtimes[i] for i in result[1]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_dp_within_quantization_of_ilp(data):
    memory = data.draw(weights)
    runtimes = data.draw(st.lists(st.floats(0.0, 100.0), min_size=len(memory),
                                  max_size=len(memory)))
    max_memory = data.draw(st.floats(0.0, 1.5))
    n = len(memory)
    # Rounding moves each weight by at most half a quantum: the DP may overshoot by that much,
    # and it is optimal for capacities between the ILP's with shrunk and with grown weights.
    quantum = 0.5 / QUANTIZATION_SCALE
    value = check_partition(dp_knapsack(memory, runtimes, max_memory), n, memory, max_memory,
                            slack=(n + 1) * quantum)
    tight = ilp_knapsack(memory, runtimes, max(max_memory - (n + 1) * quantum, 0))[0]
    loose = ilp_knapsack(memory, runtimes, max_memory + (n + 1) * quantum)[0]
    assert tight - 1e-3 <= value <= loose + 1e-3


@pytest.mark.parametrize("seed", range(20))
def test_dp_gives_torchs_answer(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    memory = (rng.random(n) * 3 / n).tolist()
    if seed % 4 == 0:
        memory[n // 2] = 0.0  # zero-size items are always saved
    runtimes = rng.integers(1, 10**6, n).astype(float).tolist()
    max_memory = float(rng.random())
    ours = dp_knapsack(memory, runtimes, max_memory)
    theirs = torch_knapsack.dp_knapsack(memory, runtimes, max_memory)
    assert ours[1] == sorted(theirs[1])
    assert ours[2] == sorted(theirs[2])
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6)


def _hard_instance(seed):
    """Instances where bound-fixing could go wrong: ties, duplicates, zero weights and values,
    values spread over 15 orders of magnitude (float32 absorbs the small ones)."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 300))
    kind = seed % 5
    memory = rng.random(n) * rng.uniform(1, 5) / n
    runtimes = rng.integers(1, 10**7, n).astype(float)
    if kind == 0:
        memory[rng.random(n) < 0.1] = 0.0
        runtimes[rng.random(n) < 0.1] = 0.0
    elif kind == 1:
        memory = np.round(memory * 2000) / 2000  # many equal weights
    elif kind == 2:
        runtimes = rng.integers(1, 5, n).astype(float)  # many equal sums
    elif kind == 3:
        runtimes = rng.random(n) * 10 ** rng.uniform(-3, 12, n)
    else:
        half = n // 2  # every item twice
        memory[half:2 * half] = memory[:half]
        runtimes[half:2 * half] = runtimes[:half]
    return memory.tolist(), runtimes.tolist(), float(rng.uniform(0, sum(memory) * 1.1))


@pytest.mark.parametrize("seed", range(25))
def test_dp_gives_torchs_answer_on_hard_instances(seed):
    memory, runtimes, max_memory = _hard_instance(seed)
    ours = dp_knapsack(memory, runtimes, max_memory)
    theirs = torch_knapsack.dp_knapsack(memory, runtimes, max_memory)
    assert ours[1] == sorted(theirs[1])
    assert np.float32(ours[0]) == np.float32(theirs[0])


def test_bounds_settle_most_items_of_a_large_instance():
    """The speed of dp_knapsack comes from items the LP bounds settle; keep it that way, and
    the settled items must agree with the full table's answer."""
    from aot_partition.knapsack import ALWAYS, NEVER, _fix_items, _quantize

    rng = np.random.default_rng(0)
    memory = rng.random(500) * 4 / 500
    runtimes = rng.integers(1, 10**7, 500).astype(float)
    for max_memory in (0.2, 0.5, 0.9):
        q_mem, capacity = _quantize(memory, max_memory, QUANTIZATION_SCALE)
        status = _fix_items(q_mem, runtimes, capacity)
        assert (status != 0).mean() > 0.5, max_memory
        saved = set(torch_knapsack.dp_knapsack(memory.tolist(), runtimes.tolist(),
                                               max_memory)[1])
        assert all(i in saved for i in np.flatnonzero(status == ALWAYS).tolist())
        assert not any(i in saved for i in np.flatnonzero(status == NEVER).tolist())


@pytest.mark.parametrize("seed", range(10))
def test_hirschberg_variant_is_optimal_like_the_table(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 60))
    memory = (rng.random(n) * 2 / n).tolist()
    runtimes = rng.random(n).tolist()
    max_memory = float(rng.random())
    table = dp_knapsack(memory, runtimes, max_memory)
    light = dp_knapsack_hirschberg(memory, runtimes, max_memory)
    forced = dp_knapsack(memory, runtimes, max_memory, table_bytes_limit=0)
    assert light[0] == pytest.approx(table[0], rel=1e-5)
    assert forced[0] == pytest.approx(table[0], rel=1e-5)
    q = np.rint(np.asarray(memory) * QUANTIZATION_SCALE)
    assert q[light[1]].sum() <= round(max_memory * QUANTIZATION_SCALE)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_greedy_respects_capacity_and_matches_torch(data):
    memory = data.draw(st.lists(st.floats(1e-3, 0.5), min_size=1, max_size=30))
    runtimes = data.draw(st.lists(st.floats(0.0, 100.0), min_size=len(memory),
                                  max_size=len(memory)))
    max_memory = data.draw(st.floats(0.0, 1.5))
    result = greedy_knapsack(memory, runtimes, max_memory)
    check_partition(result, len(memory), memory, max_memory)
    theirs = torch_knapsack.greedy_knapsack(memory, runtimes, max_memory)
    assert result[1] == sorted(theirs[1])


def test_greedy_takes_free_items_first():
    value, saved, recompute = greedy_knapsack([0.0, 0.6, 0.5], [1.0, 10.0, 9.0], 0.5)
    assert saved == [0, 2] and recompute == [1] and value == 10.0


def test_empty_and_negative_capacity():
    for solver in (greedy_knapsack, dp_knapsack, ilp_knapsack):
        assert solver([], [], 1.0) == (0.0, [], [])
    assert dp_knapsack([0.1, 0.2], [1.0, 2.0], -1.0) == (0.0, [], [0, 1])


def test_bad_inputs_name_the_culprit():
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        dp_knapsack([0.1, 0.2], [1.0], 1.0)
    with pytest.raises(ValueError, match=r"memory\[1\] = -0.2 must be finite and >= 0"):
        greedy_knapsack([0.1, -0.2], [1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="max_memory must be a finite number, got inf"):
        ilp_knapsack([0.1], [1.0], float("inf"))
    with pytest.raises(ValueError, match="Unknown knapsack solver 'magic'; valid: dp, greedy, ilp"):
        get_knapsack_solver("magic")
