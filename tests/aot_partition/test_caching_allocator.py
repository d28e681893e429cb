"""memory_models/caching_allocator.py: the CUDA caching allocator's blocks, as max_memory_allocated counts
them. Pure logic here; on a GPU the model is checked against the real allocator."""

from __future__ import annotations

import random

import pytest
import torch
from aot_partition.memory_models.caching_allocator import (
    CachingAllocator,
    StepEvents,
    replay,
    round_size,
    segment_size,
)

MiB = 1 << 20


def test_requests_round_to_512_bytes():
    assert [round_size(n) for n in (1, 511, 512, 513, 4096)] == [512, 512, 512, 1024, 4096]


def test_segments_by_pool_and_size():
    assert segment_size(512) == 2 * MiB                 # small pool
    assert segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB          # large pool, under 10 MiB
    assert segment_size(10 * MiB) == 10 * MiB          # rounded up to 2 MiB
    assert segment_size(11 * MiB) == 12 * MiB


def test_a_cached_block_too_big_to_split_is_handed_out_whole():
    allocator = CachingAllocator()
    allocator.malloc("a", 3 * MiB)
    allocator.free("a")                                 # a free 20 MiB segment
    allocator.malloc("b", 19 * MiB + 512)               # 1 MiB - 512 would remain: not split
    assert allocator.allocated == 20 * MiB
    allocator.free("b")
    allocator.malloc("c", 18 * MiB)                     # 2 MiB would remain: split
    assert allocator.allocated == 18 * MiB
    assert allocator.reserved == 20 * MiB


def test_the_opposite_case_small_blocks_split_down_to_512_bytes():
    allocator = CachingAllocator()
    allocator.malloc("a", 1000)
    allocator.malloc("b", MiB)
    allocator.malloc("c", MiB - 1536)                   # 512 bytes remain: still split
    assert allocator.allocated == 2 * MiB - 512
    assert allocator.reserved == 2 * MiB


def test_freed_neighbours_merge_and_the_best_fit_is_taken():
    allocator = CachingAllocator()
    for key in "abc":
        allocator.malloc(key, 4 * MiB)                  # one 20 MiB segment, 8 MiB left
    allocator.free("a")
    allocator.free("b")                                 # a + b merge into 8 MiB at the front
    allocator.malloc("d", 8 * MiB)                      # best fit: exactly the merged block
    assert allocator.allocated == 12 * MiB and allocator.reserved == 20 * MiB
    assert allocator.peak == 12 * MiB


def test_a_live_key_cannot_be_allocated_twice():
    allocator = CachingAllocator()
    allocator.malloc("a", 512)
    with pytest.raises(ValueError, match="allocation 'a' is already live"):
        allocator.malloc("a", 512)


def test_replay_reaches_the_steady_state_of_a_loop():
    # Step: 3 MiB, then 2.5 MiB; the 3 MiB freed; then 2 MiB takes a cached block.
    steps = [StepEvents((("x", 3 * MiB),), 0, ()),
             StepEvents((("y", 5 * MiB // 2),), 0, ("x",)),
             StepEvents((("z", 2 * MiB),), 0, ()),
             StepEvents((), MiB, ("y", "z"))]
    marks = replay(steps)
    assert [high for high, _ in marks] == [3 * MiB, 11 * MiB // 2, 5 * MiB // 2 + 3 * MiB,
                                          5 * MiB // 2 + 3 * MiB + MiB]
    # the 2 MiB request got the freed 3 MiB block whole (1 MiB would remain: not split)
    assert marks[2][1] - marks[1][1] == 3 * MiB
    assert marks[-1][1] == 0


def _random_program(seed: int, n: int = 300) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    live: list[int] = []
    program: list[tuple[str, int, int]] = []
    for key in range(n):
        if live and rng.random() < 0.45:
            program.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(4096, MiB),
                               rng.randrange(MiB, 12 * MiB)])
            program.append(("alloc", key, size))
            live.append(key)
    return program


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_model_counts_what_the_cuda_allocator_counts(seed):
    program = _random_program(seed)
    model = CachingAllocator()
    pool = torch.cuda.MemPool()  # a fresh pool: no blocks cached before the program
    seen, expected = [], []
    with torch.cuda.use_mem_pool(pool):
        tensors: dict[int, torch.Tensor] = {}
        start = torch.cuda.memory_allocated()
        for kind, key, size in program:
            if kind == "alloc":
                tensors[key] = torch.empty(size, dtype=torch.uint8, device="cuda")
                model.malloc(key, size)
            else:
                del tensors[key]
                model.free(key)
            seen.append(torch.cuda.memory_allocated() - start)
            expected.append(model.allocated)
        tensors.clear()
    assert seen == expected
