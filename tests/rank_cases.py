"""Tiny functions for tests/test_ranks.py, run on every rank by ranks.run_ranks."""

import time

import torch
import torch.distributed as dist


def all_reduce_rank() -> float:
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    return float(value)


def raise_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("boom")


def rank_zero_waits_alone() -> None:
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: a deadlock
    else:
        time.sleep(600)


def sleep_then_mark(seconds: float) -> int:
    """Longer than run_ranks' timeout before the timed part, nothing after it."""
    from ranks import mark_ready

    time.sleep(seconds)
    mark_ready()
    return dist.get_rank()


def stall_after_one_round() -> None:
    """One round counted, then a deadlock: rank 0 in an all-reduce rank 1 never joins."""
    from ranks import mark_ready, report_progress

    mark_ready()
    report_progress(1)
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(600)


def count_slowly(rounds: int, pause: float) -> int:
    """Slow but never stalled: a count every ``pause`` seconds."""
    from ranks import mark_ready, report_progress

    mark_ready()
    for done in range(rounds):
        time.sleep(pause)
        report_progress(done + 1)
    return rounds

