"""How many chunks of tokens a split tries under a peak cap, from the gap to close and the
shapes.

The counts are powers of two. First those that keep at least ``MIN_CHUNK_TOKENS`` tokens a
chunk (a matmul of fewer rows runs far below the device's peak), from the fewest whose
estimated saving covers the gap; then, only for a cap none of those reaches, on down to
``LAST_RESORT_CHUNK_TOKENS`` tokens a chunk, those whose estimated saving covers the gap
(issue 50: a 1,024-token Llama step stopped at 8 chunks, 32.2 MiB, where split=32 peaks at
20.5 MiB). torch's ``F.linear_cross_entropy`` sizes its chunks from the shapes alone
(``torch_aspect_ratio_rows``: a chunk's logits about the size of the hidden states, halved on
CPU fp32: 2 rows a chunk at vocab 32k, dim 64); here the cap decides, so a step splits no finer
than it must.
"""

from __future__ import annotations

from collections.abc import Callable

MIN_CHUNK_TOKENS = 128
LAST_RESORT_CHUNK_TOKENS = 16
MAX_CHUNKS = 64
MAX_LAST_RESORT_CHUNKS = 256


def most_chunks(tokens: int) -> int:
    """The most chunks (a power of two, at least 2) keeping ``MIN_CHUNK_TOKENS`` a chunk."""
    k = 2
    while k * 2 <= min(MAX_CHUNKS, tokens // MIN_CHUNK_TOKENS):
        k *= 2
    return k


def counts_for_gap(tokens: int, saving: Callable[[int], int], gap_bytes: int) -> list[int]:
    """The chunk counts to try, in order: from the fewest (>= ``MIN_CHUNK_TOKENS`` a chunk)
    whose ``saving(k)`` covers ``gap_bytes`` up to ``most_chunks``, then the last resorts
    (doubling while ``LAST_RESORT_CHUNK_TOKENS`` a chunk remain) whose saving covers the gap,
    tried only if those fail."""
    most = most_chunks(tokens)
    counts = [2]
    while counts[-1] < most:
        counts.append(counts[-1] * 2)
    first = next((i for i, k in enumerate(counts) if saving(k) >= gap_bytes), len(counts) - 1)
    counts = counts[first:]
    k = most * 2
    while k <= MAX_LAST_RESORT_CHUNKS and tokens // k >= LAST_RESORT_CHUNK_TOKENS:
        if saving(k) >= gap_bytes:  # a gap no count could close adds no compile to try
            counts.append(k)
        k *= 2
    return counts


def torch_aspect_ratio_rows(tokens: int, vocab: int, dim: int, factor: int = 2) -> int:
    """Rows a chunk under ``F.linear_cross_entropy``'s "aspect_ratio:factor" rule (torch 2.13's
    default; factor 1 for bf16/fp16 on CPU): the next power of two of tokens / ceil(vocab /
    dim), divided by ``factor``, at most ``tokens`` (the reference the bench compares with)."""
    target = -(-tokens // -(-vocab // dim))
    return max(1, min((1 << (target - 1).bit_length()) // factor, tokens))
