"""benchmarks/partition_bench.py --smoke keeps running: one small model, one budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_smoke_run_writes_json_markdown_and_png(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "partition_bench.py")
    done = subprocess.run([sys.executable, script, "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "partition_bench.json").read_text())
    by_mode: dict = {}
    for row in result["rows"]:
        by_mode.setdefault(row["graph_modules"], {})[row["partitioner"]] = row
    assert list(by_mode) == ["lazy", "direct", "eager"]
    # Torch does the same work in a direct call as in "eager": timed once, shown in both.
    assert by_mode["direct"]["torch"] == dict(by_mode["eager"]["torch"], graph_modules="direct")
    rows = by_mode["lazy"]
    assert {"torch", "ours"} <= set(rows)
    for row in rows.values():
        assert row["budget"] == 0.5 and row["seconds"] > 0 and row["saved_bytes"] > 0
    # Same algorithm and knapsack as torch: never more saved bytes at the same budget.
    assert rows["ours"]["saved_bytes"] <= rows["torch"]["saved_bytes"]
    assert all(k["same_answer"] for k in result["knapsack"])
    # Batch norm under a budget: torch's partitioner fails autograd's version check, ours
    # equals eager.
    correct = {row["partitioner"]: row for row in result["correctness"]}
    assert correct["ours"]["correct"] and correct["ours"]["max_error"] == 0.0
    assert not correct["torch"]["correct"]
    assert correct["torch"]["error"].startswith(
        "RuntimeError: one of the variables needed for gradient computation")
    assert "| model | nodes | budget |" in (tmp_path / "partition_bench.md").read_text()
    assert (tmp_path / "pareto_gpt-1.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_memory_tradeoff_smoke_scores_both_partitioners_in_bytes(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "memory_tradeoff_bench.py")
    done = subprocess.run([sys.executable, script, "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "memory_tradeoff.json").read_text())
    points = result["points"]
    torch_points = {p["budget"]: p for p in points if p["partitioner"] == "torch"}
    ours = {p["budget"]: p for p in points if p["partitioner"] == "ours"}
    assert set(torch_points) == set(ours) == {"1", "0.5", "0"}
    # At 1.0 both take the runtime-optimal cut: the same saved bytes and the same peak.
    assert ours["1"]["saved_bytes"] == torch_points["1"]["saved_bytes"]
    assert ours["1"]["simulated_peak"] == torch_points["1"]["simulated_peak"]
    # A peak cap placed at torch's peak is kept.
    caps = [p for p in points if p["partitioner"] == "ours:peak"]
    assert caps and all(p["simulated_peak"] <= int(p["budget"]) for p in caps)
    assert (tmp_path / "memory_tradeoff_gpt-1.png").read_bytes()[:4] == b"\x89PNG"


def test_memory_tradeoff_counts_random_ops_torch_draws_again(capture):
    """The bench labels torch's answers that redraw dropout in the backward (wrong gradients,
    issue 12); ours replays the forward's RNG state, which does not count."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import memory_tradeoff_bench as bench
        from partition_bench import Joint
    finally:
        sys.path.pop(0)
    from zoo import make_case

    case = make_case("dropout")
    captured = capture(case.module, *case.inputs)
    joint = Joint("dropout", captured.module, captured.inputs, captured.num_fwd_outputs)
    static = [0, 1, 2, 3]  # the two layers' weights and biases lead the primals
    redrawn = {}
    for who in ("torch", "ours"):
        fw, bw = bench.partition(joint, who, static, fraction=0.0)
        redrawn[who] = bench.score(joint, who, "0", fw, bw, static).redrawn_random_ops
    assert redrawn["torch"] > 0
    assert redrawn["ours"] == 0
