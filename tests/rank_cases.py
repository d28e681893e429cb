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
