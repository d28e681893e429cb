"""benchmarks/chunkers_bench.py --smoke: each variant in its own process with an empty Inductor
cache (eager, Inductor with its auto_chunker, ours split in 4) on a tiny GPT; every row
measured, every loss equal to eager's, the table written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "chunkers_bench.py")


@pytest.mark.slow  # two cold Inductor compiles in fresh processes
def test_the_smoke_run_measures_every_variant_and_each_loss_matches_eager(tmp_path):
    done = subprocess.run([sys.executable, BENCH, "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "chunkers_bench.json").read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    assert list(rows) == ["eager", "inductor+ac", "split4"], rows
    for key, row in rows.items():
        assert row["note"] == "", (key, row["note"])
        assert row["peak_mib"] > 0 and row["step_ms"] > 0 and row["compile_s"] > 0, row
        assert row["loss_matches"] is True, (key, row["loss"], rows["eager"]["loss"])
        if key != "eager":
            assert row["grad_error"] < 1e-5, (key, row["grad_error"])
    assert "auto_chunker chunked 1 graph" in rows["inductor+ac"]["split"]
    assert rows["split4"]["split"] == "loss in 4 (forward grads)"
    # both chunkers keep one chunk's logits, not the whole: under eager's peak
    assert rows["split4"]["peak_mib"] < rows["eager"]["peak_mib"]
    assert rows["inductor+ac"]["peak_mib"] < rows["eager"]["peak_mib"]
    table = (tmp_path / "chunkers_bench.md").read_text()
    assert "| ours split=4 |" in table and "| inductor + auto_chunker |" in table


def test_a_cap_without_its_reference_row_is_a_row_saying_so():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import chunkers_bench as bench

    cap, note = bench._cap_bytes(bench.VARIANTS["cap-ac"], [])
    assert cap is None and note == "no cap: no measured inductor + auto_chunker peak"
    rows = [bench.Row("m", "eager", "eager", peak_mib=100.0, step_ms=10.0, inputs_mib=2.0),
            bench.Row("m", "lce-inductor", "F.lce", peak_mib=10.0, step_ms=9.0),
            bench.Row("m", "lce-ours", "F.lce ours", peak_mib=8.0, step_ms=9.0)]
    cap, note = bench._cap_bytes(bench.VARIANTS["cap-lce"], rows)
    assert cap == int(10.0 * bench.MIB) and "F.lce ours's peak" in note


def test_the_targets_say_met_or_missed_with_the_numbers():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import chunkers_bench as bench

    def row(key, peak, step):
        return bench.Row("m", key, key, peak_mib=peak, step_ms=step)

    base = [row("inductor", 300.0, 100.0), row("inductor+ac", 100.0, 120.0),
            row("lce-inductor", 50.0, 150.0), row("lce-ours", 60.0, 140.0)]
    t1, t2 = bench.targets(base + [row("split8", 60.0, 95.0)])
    assert t1.startswith("- T1 (met)") and "40% under its 100.0 MiB" in t1
    assert t2.startswith("- T2 (missed)") and "20% above it" in t2
    t1, t2 = bench.targets(base + [row("split8", 52.0, 125.0), row("split32", 110.0, 110.0)])
    assert t1.startswith("- T1 (missed)") and "(4% slower)" in t1 and "10% over" in t1
    assert "the fastest of ours within 5% of its peak is split8 52.0 MiB, 125 ms, 25% slower" \
        in t2
    (t1, t2) = bench.targets(base + [row("cap-lce", 52.0, 99.0)])
    assert t2 == ("- T2 (met), F.linear_cross_entropy's peak 50.0 MiB (lce-inductor; within "
                  "5%: <= 52.5 MiB) at no more than inductor's 100 ms: cap-lce 52.0 MiB, 99 ms.")
