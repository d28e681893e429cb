"""Knapsack solvers: exact against brute force, DP against torch's, greedy within capacity."""

from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest
from aot_partition.core.knapsack import (
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
        if fits(memory, [i for i, b in enumerate(mask) if b], max_memory):
            best = max(best, sum(r for r, b in zip(runtimes, mask) if b))
    return best


def fits(memory, saved, max_memory):
    """The exact test: fsum rounds correctly, so its sign is the exact sum's."""
    return math.fsum([memory[i] for i in saved] + [-max_memory]) <= 0


def check_partition(result, n, memory, max_memory):
    value, saved, recompute = result
    assert sorted(saved + recompute) == list(range(n))
    assert saved == sorted(saved)
    assert fits(memory, saved, max_memory)
    return value


def assert_torchs_dp_answer(memory, runtimes, max_memory, ours):
    """torch's dp answer where it fits; where rounding lets it overflow, ours fits and is
    optimal up to weights rounded up (HiGHS stops at a 1e-4 relative gap)."""
    theirs = torch_knapsack.dp_knapsack(memory, runtimes, max_memory)
    if fits(memory, theirs[1], max_memory):
        assert ours[1] == sorted(theirs[1])
        assert ours[2] == sorted(theirs[2])
        assert np.float32(ours[0]) == np.float32(theirs[0])
        return True
    check_partition(ours, len(memory), memory, max_memory)
    tight = max(max_memory - (len(memory) + 1) / QUANTIZATION_SCALE, 0.0)
    assert ours[0] >= ilp_knapsack(memory, runtimes, tight)[0] * (1 - 2e-4) - 1e-9
    return False


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
    # Rounding moves each weight by at most half a quantum (rounded up, when rounding to the
    # nearest overflows: at most one): the DP never overshoots, and it is optimal for
    # capacities between the ILP's with grown and with shrunk weights.
    quantum = 0.5 / QUANTIZATION_SCALE
    value = check_partition(dp_knapsack(memory, runtimes, max_memory), n, memory, max_memory)
    tight = ilp_knapsack(memory, runtimes, max(max_memory - 2 * (n + 1) * quantum, 0))[0]
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
    assert_torchs_dp_answer(memory, runtimes, max_memory,
                            dp_knapsack(memory, runtimes, max_memory))


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
    assert_torchs_dp_answer(memory, runtimes, max_memory,
                            dp_knapsack(memory, runtimes, max_memory))


def test_torchs_dp_overflows_often_and_ours_never():
    """Rounding to the nearest quantum lets torch's answer weigh more than max_memory on
    ordinary inputs (7 of the 45 above); the comparisons above cover both branches."""
    overflows = 0
    for seed in range(25):
        memory, runtimes, max_memory = _hard_instance(seed)
        theirs = torch_knapsack.dp_knapsack(memory, runtimes, max_memory)
        overflows += not fits(memory, theirs[1], max_memory)
        check_partition(dp_knapsack(memory, runtimes, max_memory), len(memory), memory,
                        max_memory)
    assert overflows >= 3


def test_bounds_settle_most_items_of_a_large_instance():
    """The speed of dp_knapsack comes from items the LP bounds settle; keep it that way, and
    the settled items must agree with the full table's answer."""
    from aot_partition.core.knapsack import ALWAYS, NEVER, _fix_items, _quantize

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
    assert light == table
    assert forced == table
    check_partition(light, n, memory, max_memory)


def _tie_instance(seed):
    """Many optimal choices: equal weights and runtimes, duplicated items, equal ratios,
    weights that round to 0, zero runtimes."""
    rng = np.random.default_rng(5000 + seed)
    n = int(rng.integers(2, 70))
    kind = seed % 6
    if kind == 0:  # all the same item
        memory = np.full(n, rng.choice([0.01, 0.0123, 0.05, 1 / 3]))
        runtimes = np.full(n, float(rng.integers(1, 4)))
    elif kind == 1:  # a few distinct items, each many times
        memory = rng.choice(np.round(rng.random(3) * 0.2, 3), n)
        runtimes = rng.choice([1.0, 2.0, 3.0], n)
    elif kind == 2:  # runtime proportional to memory: every ratio ties
        memory = rng.integers(1, 20, n) / 200
        runtimes = memory * 1000
    elif kind == 3:  # every item twice, in two orders
        half = rng.integers(1, 30, n // 2 + 1) / 300
        memory = np.concatenate([half, half[::-1]])[:n]
        runtimes = np.round(memory * 50)
    elif kind == 4:  # equal runtimes, and a third of the weights round to 0
        memory = rng.integers(0, 40, n) / 10_000 + 0.00004
        memory[rng.random(n) < 1 / 3] = 0.00004
        runtimes = np.ones(n)
    else:  # equal weights, runtimes 0 or 1
        memory = np.full(n, 0.02)
        runtimes = rng.integers(0, 2, n).astype(float)
    top = min(memory.sum() * 0.8, 1.0)  # capacity 10,000 quanta at most: torch's table is slow
    max_memory = float(np.round(rng.uniform(0, top), int(rng.integers(2, 6))))
    return memory.tolist(), runtimes.tolist(), max_memory


def _items_in_table(memory, runtimes, max_memory):
    """How many items the bounds leave to the (rounded-weights) table."""
    from aot_partition.core.knapsack import ALWAYS, UNDECIDED, _fix_items, _quantize

    q_mem, capacity = _quantize(np.asarray(memory), max_memory, QUANTIZATION_SCALE)
    status = _fix_items(q_mem, np.asarray(runtimes), capacity)
    top = capacity - q_mem[status == ALWAYS].sum()
    return int(((status == UNDECIDED) & (q_mem <= top)).sum())


@pytest.mark.parametrize("seed", range(36))
def test_light_path_breaks_ties_like_the_table(seed, caplog):
    """Same answer, to the bit, whichever path dp_knapsack takes; torch's where it fits."""
    memory, runtimes, max_memory = _tie_instance(seed)
    table = dp_knapsack(memory, runtimes, max_memory)
    with caplog.at_level(logging.DEBUG, logger="aot_partition.core.knapsack"):
        light = [dp_knapsack(memory, runtimes, max_memory, table_bytes_limit=limit)
                 for limit in (0, 1, 300, 5_000)]
    light.append(dp_knapsack_hirschberg(memory, runtimes, max_memory))
    for result in light:
        assert result == table
    if _items_in_table(memory, runtimes, max_memory) >= 2:  # else there is nothing to split
        assert "row-checkpointing" in caplog.text
    check_partition(table, len(memory), memory, max_memory)
    assert_torchs_dp_answer(memory, runtimes, max_memory, table)


def test_many_items_rounding_to_zero_stay_within_capacity(caplog):
    """100,000 items of at most 0.4 quantum round to weight 0: the rounded DP (torch's)
    saves them all, 1.998 against a capacity of 0.5."""
    rng = np.random.default_rng(0)
    n = 100_000
    memory = (rng.random(n) * 4e-5).tolist()
    runtimes = rng.random(n).tolist()
    assert math.fsum(memory) > 1.99
    assert not np.rint(np.asarray(memory) * QUANTIZATION_SCALE).any()
    greedy_value = check_partition(greedy_knapsack(memory, runtimes, 0.5), n, memory, 0.5)
    table = dp_knapsack(memory, runtimes, 0.5)
    with caplog.at_level(logging.DEBUG, logger="aot_partition.core.knapsack"):
        light = dp_knapsack(memory, runtimes, 0.5, table_bytes_limit=20_000)
    assert "row-checkpointing" in caplog.text and "overflow" in caplog.text
    assert light == table
    value = check_partition(table, n, memory, 0.5)
    assert math.fsum(memory[i] for i in table[1]) > 0.4999
    assert value >= greedy_value * (1 - 1e-12)


def _capacity_instance(seed):
    """Weights just off the quantization grid, tiny ones that round to 0, exact sums."""
    rng = np.random.default_rng(9000 + seed)
    n = int(rng.integers(1, 40))
    kind = seed % 4
    if kind == 0:  # a hair above a multiple of the quantum: rounding to the nearest is low
        memory = rng.integers(1, 3000, n) / QUANTIZATION_SCALE + rng.uniform(0, 4.9e-5, n)
    elif kind == 1:  # mostly below half a quantum
        memory = rng.random(n) * 6e-5
    elif kind == 2:  # decimal fractions whose float sums round either way
        memory = rng.choice([0.1, 0.2, 0.3, 0.7, 0.00005, 0.00015], n)
    else:
        memory = rng.random(n) * 3 / n
    runtimes = rng.random(n) * 10 ** rng.uniform(0, 6)
    pick = rng.random(n) < 0.5
    # Capacities on the grid, off it, and equal to the exact weight of a subset.
    max_memory = float(rng.choice([memory[pick].sum(), round(memory.sum() * rng.random(), 4),
                                   memory.sum() * rng.random()]))
    return memory.tolist(), runtimes.tolist(), max_memory


@pytest.mark.parametrize("seed", range(40))
def test_no_solver_saves_more_than_max_memory(seed):
    memory, runtimes, max_memory = _capacity_instance(seed)
    for solver in (greedy_knapsack, dp_knapsack, dp_knapsack_hirschberg, ilp_knapsack):
        check_partition(solver(memory, runtimes, max_memory), len(memory), memory, max_memory)
    check_partition(dp_knapsack(memory, runtimes, max_memory, table_bytes_limit=0),
                    len(memory), memory, max_memory)


ALL_SOLVERS = [greedy_knapsack, dp_knapsack, dp_knapsack_hirschberg, ilp_knapsack]


@pytest.mark.parametrize("solver", ALL_SOLVERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("max_memory", [-1.0, -1e-9, -0.00004, -np.float64(0.3)])
def test_negative_capacity_saves_nothing(solver, max_memory):
    """Even zero-size items: nothing fits under a negative capacity (-0.00004 rounds to a
    quantized capacity of 0)."""
    assert solver([0.0, 0.1, 0.00001], [1.0, 2.0, 3.0], max_memory) == (0.0, [], [0, 1, 2])
    assert solver([], [], max_memory) == (0.0, [], [])


@pytest.mark.parametrize("solver", ALL_SOLVERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("max_memory, shown", [("0.5", "'0.5'"), (None, "None"),
                                               ([0.5], "[0.5]"), (True, "True"),
                                               (float("nan"), "nan")])
def test_non_numeric_max_memory(solver, max_memory, shown):
    with pytest.raises(ValueError) as raised:
        solver([0.1], [1.0], max_memory)
    assert str(raised.value) == f"max_memory must be a finite number, got {shown}"


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
    for solver in ALL_SOLVERS:
        assert solver([], [], 1.0) == (0.0, [], [])
        assert solver([0.1, 0.2], [1.0, 2.0], -1.0) == (0.0, [], [0, 1])


def test_bad_inputs_name_the_culprit():
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        dp_knapsack([0.1, 0.2], [1.0], 1.0)
    with pytest.raises(ValueError, match=r"memory\[1\] = -0.2 must be finite and >= 0"):
        greedy_knapsack([0.1, -0.2], [1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="max_memory must be a finite number, got inf"):
        ilp_knapsack([0.1], [1.0], float("inf"))
    with pytest.raises(ValueError, match="Unknown knapsack solver 'magic'; valid: dp, greedy, ilp"):
        get_knapsack_solver("magic")
