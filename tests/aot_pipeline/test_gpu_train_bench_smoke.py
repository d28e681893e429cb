"""benchmarks/gpu_train_bench.py keeps running: tiny models on CPU, each variant in a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from subprocess_limits import SUBPROCESS_TIMEOUT_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_tiny_cpu_run_writes_one_table_with_losses_and_captures(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "gpu_train_bench.py")
    done = subprocess.run(
        [sys.executable, script, "--device", "cpu", "--size", "tiny", "--models", "llama",
         "--variants", "eager,ours_ca", "--steps", "2", "--warmup", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_train_bench.json").read_text())
    rows = {(row["model"], row["variant"]): row for row in result["rows"]}
    # One model keeps CI short: the transformers Llama, the path users bring.
    assert set(rows) == {("llama", "eager"), ("llama", "ours_ca")}
    for (model, variant), row in rows.items():
        assert len(row["losses"]) == 3 and row["first_step_s"] > 0 and row["median_ms"] > 0
        # fp32 on CPU: the compiled run trains like eager, and the backward is captured once.
        assert row["loss_agrees"] and row["loss_max_rel_diff"] <= 1e-3, (model, variant)
        assert row["captures"] == (1 if variant == "ours_ca" else None)
    table = (tmp_path / "gpu_train_bench.md").read_text()
    assert "| model | variant | first step s | median ms |" in table
    assert "| llama | ours_ca |" in table


def test_unknown_variant_is_refused_before_any_run(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "gpu_train_bench.py")
    done = subprocess.run([sys.executable, script, "--variants", "theirs@0.3", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 2
    assert "unknown variants ['theirs@0.3']; valid: eager, inductor@1.0" in done.stderr


@pytest.mark.parametrize(("variant", "message"), [
    ("ours@0.3+foo=1", "variant 'ours@0.3+foo=1': 'foo=1' is not key=value with a key from "
                       "est, solver, peak"),
    ("ours@1.3", "variant 'ours@1.3': memory_budget must be in [0, 1]"),
    ("ours@1.0+peak=lots", "variant 'ours@1.0+peak=lots': cannot read size 'lots': write a number and a unit"),
    ("ours@1.0+peak=0.5", "variant 'ours@1.0+peak=0.5': cannot read size '0.5': write a number and a unit"),
    ("ours@0.5+peak=6GB", "variant 'ours@0.5+peak=6GB': 'peak=6GB': a peak cap is the whole budget; write ours@1.0+peak=6GB"),
])
def test_bad_partitioner_flags_are_refused_before_any_run(tmp_path, variant, message):
    script = os.path.join(ROOT, "benchmarks", "gpu_train_bench.py")
    done = subprocess.run([sys.executable, script, "--variants", variant, "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 2
    assert message in done.stderr


def test_ours_variant_names_budget_and_flags():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import gpu_train_bench
    finally:
        sys.path.pop(0)
    parse = gpu_train_bench.parse_ours_variant
    assert parse("ours@0.4") == (0.4, {})
    assert parse("ours@0.4+est=roofline+solver=ilp_graph") == (0.4, {
        "activation_memory_budget_runtime_estimator": "roofline",
        "activation_memory_budget_solver": "ilp_graph"})
    # a peak cap is the pipeline's budget: a patched peak flag would be overridden by it
    assert parse("ours@1.0+peak=6GB") == ("6000000000 peak", {})
    assert parse("ours@1.0+peakfrac=0.8+est=roofline") == (
        "0.8 peak", {"activation_memory_budget_runtime_estimator": "roofline"})
    with pytest.raises(ValueError, match=r"'peak=6GB': a peak cap is the whole budget; "
                                         r"write ours@1.0\+peak=6GB"):
        parse("ours@0.5+peak=6GB")
    assert parse("ours@300MiB") == ("300MiB", {})
