"""A model of PyTorch's CUDA caching allocator, for what ``max_memory_allocated`` counts.

``torch.cuda.max_memory_allocated`` is the peak of the bytes in *blocks* handed out, and a block
can be larger than its request: requests are rounded up to 512 bytes, and a cached free block is
handed out whole when what would remain after the request is too small to split off (1 MiB or
less for blocks over 1 MiB). Which cached block a request gets depends on every allocation and
free before it, so the overshoot depends on the order of a step's buffers, not on their sizes
alone. The rules below are those of ``c10/cuda/CUDACachingAllocator.cpp`` with the default
settings (no ``PYTORCH_CUDA_ALLOC_CONF``: no ``max_split_size_mb``, no expandable segments, no
power-of-two rounding, one stream):

- a request of ``n`` bytes needs ``round_size(n)``: at least 512, a multiple of 512;
- requests up to 1 MiB come from the small pool (2 MiB segments), larger ones from the large
  pool (20 MiB segments under 10 MiB, else the request rounded up to 2 MiB);
- a request takes the smallest cached free block of its pool that fits (lowest address on ties),
  or a new segment;
- the block is split when the rest is at least 512 bytes (small pool) or over 1 MiB (large
  pool); otherwise the whole block is allocated and counted;
- a freed block merges with free neighbours of its segment. Segments are never given back.

Pure Python, no torch: a step's allocations replayed through it (``peak_of``) give the peak a
CUDA run reports, the caching allocator's rounding and unsplit blocks included.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20            # requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20         # the small pool's segments
LARGE_SEGMENT = 20 << 20        # large pool segments for requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20           # larger requests get a segment rounded up to this


def round_size(nbytes: int) -> int:
    """The bytes a request of ``nbytes`` occupies in a block."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment cudaMalloc'ed for a (rounded) request no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[int, int]:
        return (self.size, self.address)


@dataclass
class CachingAllocator:
    """Blocks handed out and cached, as the CUDA caching allocator keeps them on one stream.

    ``malloc(key, nbytes)`` / ``free(key)``; ``allocated`` is what ``memory_allocated`` would
    read (bytes in allocated blocks), ``peak`` what ``max_memory_allocated`` would, since the
    last ``reset_peak``; ``reserved`` the segments' bytes."""

    allocated: int = 0
    peak: int = 0
    reserved: int = 0
    _pools: dict[bool, list[tuple[int, int, _Block]]] = field(
        default_factory=lambda: {True: [], False: []})
    _live: dict[Hashable, _Block] = field(default_factory=dict)
    _next_address: int = 0

    def malloc(self, key: Hashable, nbytes: int) -> int:
        """Allocate ``nbytes`` under ``key``; returns the bytes counted (the block's size)."""
        if key in self._live:
            raise ValueError(f"allocation {key!r} is already live")
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._take_cached(size, small) or self._new_segment(size, small)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = _Block(block.address + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._cache(tail)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak = max(self.peak, self.allocated)
        return block.size

    def free(self, key: Hashable) -> None:
        block = self._live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._uncache(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._cache(block)

    def reset_peak(self) -> None:
        self.peak = self.allocated

    def live(self) -> list[Hashable]:
        return list(self._live)

    def _take_cached(self, size: int, small: bool) -> _Block | None:
        pool = self._pools[small]
        at = bisect.bisect_left(pool, (size, -1))
        if at == len(pool):
            return None
        block = pool.pop(at)[2]
        return block

    def _new_segment(self, size: int, small: bool) -> _Block:
        nbytes = segment_size(size)
        block = _Block(self._next_address, nbytes, small)
        self._next_address += nbytes
        self.reserved += nbytes
        return block

    def _cache(self, block: _Block) -> None:
        bisect.insort(self._pools[block.small], (block.size, block.address, block))

    def _uncache(self, block: _Block) -> None:
        pool = self._pools[block.small]
        at = bisect.bisect_left(pool, (block.size, block.address))
        assert pool[at][2] is block
        pool.pop(at)


@dataclass(frozen=True)
class StepEvents:
    """What one step of a timeline does: allocate ``allocs`` (key, bytes), run with
    ``workspace`` bytes of scratch allocated and freed inside, then free ``frees`` (keys)."""

    allocs: tuple[tuple[Hashable, int], ...]
    workspace: int
    frees: tuple[Hashable, ...]


def replay(steps: Sequence[StepEvents], *, warmup: int = 2) -> list[tuple[int, int]]:
    """Replay a training step's events through a fresh allocator ``warmup`` times (what is
    still live at the end of a step is freed before the next, as a loop drops its gradients
    and loss), then once more: for each of that step's events, the allocated bytes at its high
    point (its allocations and workspace in) and after its frees, above what was allocated
    when the step began. Block sizes, as ``memory_allocated`` counts them.

    Buffers alive before the step (parameters, inputs) are not replayed: they sit in segments
    of their own, allocated before the loop."""
    allocator = CachingAllocator()
    marks: list[tuple[int, int]] = []
    for round_index in range(warmup + 1):
        start = allocator.allocated
        marks = []
        for index, step in enumerate(steps):
            for key, nbytes in step.allocs:
                allocator.malloc((round_index, key), nbytes)
            high = allocator.allocated
            if step.workspace > 0:
                high += allocator.malloc((round_index, "workspace", index), step.workspace)
                allocator.free((round_index, "workspace", index))
            for key in step.frees:
                allocator.free((round_index, key))
            marks.append((high - start, allocator.allocated - start))
        for key in allocator.live():
            allocator.free(key)
    return marks
