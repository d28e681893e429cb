"""The real-ranks helper itself: results come back in rank order, a raise and a hang fail; the
timeout counts from when every rank is ready, and a stall is told by the ranks' progress."""

import re

import pytest
from ranks import RanksFailed, run_ranks


def test_results_in_rank_order_after_a_real_all_reduce():
    assert run_ranks("rank_cases:all_reduce_rank", world_size=2, timeout=120) == [1.0, 1.0]


def test_a_rank_that_raises_fails_with_its_traceback():
    with pytest.raises(RanksFailed, match=r"rank 1 of rank_cases:raise_on_rank_one raised:(.|\n)*boom"):
        run_ranks("rank_cases:raise_on_rank_one", world_size=2, timeout=120)


def test_a_hang_fails_within_the_timeout_instead_of_blocking():
    with pytest.raises(RanksFailed, match="did not finish in 20 s") as failure:
        run_ranks("rank_cases:rank_zero_waits_alone", world_size=2, timeout=20)
    # and names where each rank waits: rank 0 in the all-reduce, rank 1 in its sleep
    message = str(failure.value)
    rank0, rank1 = message.split("--- rank 1 output ---")
    assert re.search(r'rank_cases.py", line 22 in rank_zero_waits_alone', rank0), rank0
    assert re.search(r'rank_cases.py", line 24 in rank_zero_waits_alone', rank1), rank1


def test_the_clock_starts_when_every_rank_is_ready():
    # Each rank spends longer than the timeout before its mark (as a loaded machine spends
    # importing torch): only what follows the mark is timed.
    assert run_ranks("rank_cases:sleep_then_mark", world_size=2, kwargs={"seconds": 8},
                     ready="marked", timeout=5) == [0, 1]


def test_a_stall_fails_by_its_state():
    with pytest.raises(RanksFailed, match=r"made no progress in 3 s \(a deadlock: every rank's "
                                          r"count stayed at \[1, 1\]\)"):
        run_ranks("rank_cases:stall_after_one_round", world_size=2, ready="marked",
                  stall_timeout=3, timeout=600)


def test_slow_progress_is_no_stall():
    # The opposite case: a count every second, 3 s allowed between counts, 6 s in all.
    assert run_ranks("rank_cases:count_slowly", world_size=2, kwargs={"rounds": 6, "pause": 1.0},
                     ready="marked", stall_timeout=3, timeout=600) == [6, 6]


def test_a_rank_that_fails_before_it_is_ready_stops_the_run_at_once():
    # Rank 1 cannot import the target's module, so it never joins the process group, where
    # rank 0 would wait for it until start_timeout: the run stops as soon as rank 1 is gone.
    with pytest.raises(RanksFailed, match=r"did not start: rank 1 exited before it was ready:\n"
                                          r"rank 1 raised:(.|\n)*rank 1 cannot import me"):
        run_ranks("rank_cases_import_fails:all_reduce_rank", world_size=2, timeout=600,
                  start_timeout=600)


def test_an_unknown_ready_mode_is_named():
    with pytest.raises(ValueError, match="ready must be one of started, marked; got 'later'"):
        run_ranks("rank_cases:all_reduce_rank", ready="later")
