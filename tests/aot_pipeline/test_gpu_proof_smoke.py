"""benchmarks/gpu_proof.sh, the one call a lent GPU runs, keeps running: on CPU at tiny sizes
(what CI can run), end to end, with both tables written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from subprocess_limits import SUBPROCESS_TIMEOUT_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_gpu_proof_runs_end_to_end_on_cpu(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    done = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_proof.sh"), "--device",
                           "cpu", "--size", "tiny"], capture_output=True, text=True, env=env,
                          timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    memory = json.loads((tmp_path / "compiled_memory_bench.json").read_text())
    assert memory["summary"]["cells"] == 2
    assert memory["summary"]["worst_error_pct"] <= 5.0
    assert memory["summary"]["caps_held"] == 1
    train = json.loads((tmp_path / "gpu_train_bench.json").read_text())
    rows = {row["variant"]: row for row in train["rows"]}
    assert set(rows) == {"eager", "ours@1.0+peakfrac=0.95"}
    assert all(row.get("loss_agrees") for row in rows.values()), rows
    ours = rows["ours@1.0+peakfrac=0.95"]
    assert ours["predicted_peak_bytes"] and ours["peak_step_bytes"]
    assert "| gpt2 | ours@1.0+peakfrac=0.95 |" in (tmp_path / "gpu_train_bench.md").read_text()
    split = {row["variant"]: row for row in
             json.loads((tmp_path / "split_bench.json").read_text())["rows"]}
    assert set(split) == {"eager", "inductor@1.0", "ours split=8"}
    assert split["ours split=8"]["peak_mib"] < split["inductor@1.0"]["peak_mib"]
    assert split["ours split=8"]["max_grad_error"] < 1e-5
    chunkers = json.loads((tmp_path / "chunkers_bench.json").read_text())["rows"]
    assert [(row["variant"], row["loss_matches"]) for row in chunkers] == [("eager", True)]
    assert chunkers[0]["peak_mib"] > 0


def test_a_bad_argument_is_refused():
    done = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_proof.sh"), "--size",
                           "huge"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_proof.sh: --size must be full or tiny"
