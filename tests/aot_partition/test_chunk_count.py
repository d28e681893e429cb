"""The chunk counts a split tries under a peak cap (aot_partition.split.chunk_count): the fewest
whose saving covers the gap at >= 128 tokens a chunk, then down to 16 tokens a chunk only as last
resorts (issue 50: a 1,024-token Llama step stopped at 8 chunks; split=32 peaks far lower); torch's
F.linear_cross_entropy aspect-ratio rule, the reference."""

from __future__ import annotations

import pytest
from aot_partition.split.chunk_count import counts_for_gap, most_chunks, torch_aspect_ratio_rows


def test_the_fewest_chunks_that_cover_the_gap_come_first():
    saving = lambda k: 1000 - 1000 // k  # noqa: E731 - one logits buffer less one chunk's
    assert counts_for_gap(2048, saving, 800) == [8, 16, 32, 64, 128]
    assert counts_for_gap(2048, saving, 0) == [2, 4, 8, 16, 32, 64, 128]


def test_past_128_tokens_a_chunk_only_as_last_resorts_down_to_16():
    # 1,024 tokens: 8 chunks of 128 at most, then 16, 32, 64 (16 tokens a chunk)
    assert most_chunks(1024) == 8
    saving = lambda k: 1000 - 1000 // k  # noqa: E731
    assert counts_for_gap(1024, saving, 900) == [8, 16, 32, 64]
    assert counts_for_gap(48, saving, 1) == [2]
    # a gap no count closes: the most at 128 tokens only (no compile more for an impossible cap)
    assert counts_for_gap(1024, saving, 10**9) == [8]
    assert counts_for_gap(1024, saving, 960) == [8, 32, 64]  # 16 chunks save 938


@pytest.mark.parametrize("tokens, most", [(100, 2), (256, 2), (512, 4), (1000, 4),
                                          (2**20, 64)])
def test_the_most_chunks_keep_128_tokens_and_at_most_64(tokens, most):
    assert most_chunks(tokens) == most


def test_torchs_rule_gives_2_rows_at_vocab_32k_dim_64_on_cpu_fp32():
    assert torch_aspect_ratio_rows(2048, 32768, 64) == 2       # "aspect_ratio:2"
    assert torch_aspect_ratio_rows(2048, 32768, 64, factor=1) == 4
    assert torch_aspect_ratio_rows(8, 100, 64, factor=1) == 4
    assert torch_aspect_ratio_rows(3, 1000, 64) == 1             # at least one row
