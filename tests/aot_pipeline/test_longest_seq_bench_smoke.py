"""benchmarks/longest_seq_bench.py: its static memory, its fit-and-verify loop (on made-up
totals), its report and the decomposition check on a tiny Llama (the full run takes an hour of
32-layer models: not here)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import longest_seq_bench as bench  # noqa: E402

TINY = {**bench.SMALL, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 512, "num_hidden_layers": 4}


def test_llama3_8b_static_memory():
    static = bench.static_bytes(bench.LLAMA3_8B)
    assert static["parameters"] == 8_030_261_248
    assert static["fp32_master_m_v"] > 80 * bench.GB  # why bf16 m and v are assumed
    assert static["weights_bf16"] + static["adamw_m_v_bf16"] < 80 * bench.GB


def test_search_finds_the_last_multiple_that_fits():
    assert bench.longest(lambda s: s <= 10_000, 1 << 20) == 9 * bench.STEP
    assert bench.longest(lambda s: False, 1 << 20) == 0
    assert bench.longest(lambda s: True, 8 * bench.STEP) == 8 * bench.STEP


@pytest.mark.slow  # three Inductor lowerings: about 25 s on an idle core
def test_decomposition_check_at_full_recompute():
    """Budget 0.0 saves nothing, yet each layer adds to the peak (the backward recomputes the
    forward and keeps what it needs): the saved-based extrapolation misses that, the peak
    affine in the layer count does not."""
    variant = bench.Variant("torch@0.0", "torch", 0.0)
    (row,) = bench.decomposition_check(TINY, 256, (variant,), 4)
    assert row["saved_per_layer_mib"] == 0
    assert abs(row["by_peak_error"]) < 0.03, row
    assert row["by_saved_error"] < -0.05, row
    assert row["peak_per_layer_mib"] > 0


class _LineBench(bench.Bench):
    """The bench's verification loop on a made-up total(S) (no tracing)."""

    def __init__(self, total, capacities):
        super().__init__(bench.LLAMA3_8B, capacities)
        self.total_at = total

    def measure(self, variant, seq):
        known = self.points.setdefault(variant.name, {})
        if seq not in known:
            known[seq] = bench.Point(variant.name, seq, 0, self.total_at(seq), 0, 0, 0,
                                     "backward", "buf0", "cut", None, 0.0)
        return known[seq]


def test_linear_prediction_is_verified_by_two_models():
    caps = {"raw": 80 * bench.GB, "headroom": 76 * bench.GB}
    line = _LineBench(lambda s: 48 * bench.GB + 3_000_000 * s, caps)
    rows = line.run(bench.Variant("torch@0.0", "torch", 0.0), (4096, 8192))
    assert [r.longest for r in rows] == [10240, 9216]
    assert all(r.verified and r.predicted == r.longest for r in rows)
    assert rows[0].over_total_gb > 80 >= rows[0].fits_total_gb
    assert rows[-1].measured == [4096, 8192, 9216, 10240, 11264]


def test_a_bent_line_is_still_verified():
    """The cut moves with the length: the total is not a line; the bracket still closes."""
    caps = {"raw": 80 * bench.GB}
    bent = _LineBench(lambda s: 40 * bench.GB + (2_000_000 * s if s < 20_000
                                                 else 4_000_000 * s - 40 * bench.GB), caps)
    (row,) = bent.run(bench.Variant("torch@0.5", "torch", 0.5), (8192, 16384))
    assert row.verified and row.longest == 19456 and row.predicted == 19456
    bent2 = _LineBench(lambda s: 40 * bench.GB + (1_000_000 * s if s < 20_000
                                                  else 3_000_000 * s - 40 * bench.GB), caps)
    (row,) = bent2.run(bench.Variant("torch@0.5", "torch", 0.5), (8192, 16384))
    assert row.verified and row.longest == 26624, row
    assert row.predicted == 39936


def test_nothing_fits():
    caps = {"raw": 80 * bench.GB}
    full = _LineBench(lambda s: 81 * bench.GB + s, caps)
    (row,) = full.run(bench.Variant("torch@0.0", "torch", 0.0), (4096, 8192))
    assert row.verified and row.longest == 0


def test_report_is_labelled_simulated():
    def row(name, cap, longest):
        return {"variant": name, "capacity_gb": cap, "longest": longest, "verified": True,
                "fits_total_gb": 79.5, "over_total_gb": 80.4, "predicted": longest,
                "fit_points": [8192, 12288], "measured": [8192, longest, longest + 1024],
                "cuts": 1, "peak_at": "backward `buf1`", "step_ms": 10.0}

    rows = [row("torch@0.5", 80.0, 4096), row("torch@0.5", 76.0, 3072),
            row("ours split(loss) @0.5", 80.0, 9216), row("ours split(loss) @0.5", 76.0, 6144)]
    same = [{"ours": "ours@0.5", "torch": "torch@0.5", "seq": 8192, "equal": True,
             "saved_values": 7, "cut": "x"}]
    meta = {"static_bytes": bench.static_bytes(bench.LLAMA3_8B), "machine": "x", "torch": "t",
            "transformers": "t", "date": "d", "model": "Llama-3-8B shapes", "layers": 32}
    text = bench.markdown(rows, same, meta)
    assert "SIMULATED" in text
    assert "| ours split(loss) @0.5 | 9,216 | 6,144 | 2.25x / 2.00x |" in text
    assert "| ours@0.5 | 4,096 | 3,072 |" in text
    assert "96.4 GB" in text
