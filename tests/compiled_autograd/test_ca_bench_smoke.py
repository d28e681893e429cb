"""benchmarks/compiled_autograd_bench.py keeps running: per-variant runs, then --merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from subprocess_limits import SUBPROCESS_TIMEOUT_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "compiled_autograd_bench.py")


@pytest.mark.slow
def test_variant_runs_merge_into_one_table(tmp_path):
    part = tmp_path / "part"
    done = subprocess.run([sys.executable, SCRIPT, "--variants", "eager,ours-hit", "--layers", "1",
                           "--steps", "2", "--warmup", "1", "--out", str(part)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    merged = subprocess.run([sys.executable, SCRIPT, "--merge",
                             str(part / "compiled_autograd_bench.json"), "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert merged.returncode == 0, merged.stderr[-3000:]
    result = json.loads((tmp_path / "compiled_autograd_bench.json").read_text())
    assert [r["variant"] for r in result["backward"]] == ["eager autograd"]
    assert [r["variant"] for r in result["cache_hit_overhead"]] == ["ours, cache hit"]
    assert all(r["median_ms"] > 0 for r in result["backward"] + result["cache_hit_overhead"])
    assert "each variant in its own process" in merged.stdout


def test_unknown_variant_is_named():
    done = subprocess.run([sys.executable, SCRIPT, "--variants", "ours,bogus"],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert done.returncode != 0
    assert "bogus" in done.stderr and "torch-hit" in done.stderr
