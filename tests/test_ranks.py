"""The real-ranks helper itself: results come back in rank order, a raise and a hang fail."""

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
