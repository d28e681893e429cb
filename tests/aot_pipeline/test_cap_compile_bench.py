"""benchmarks/cap_compile_bench.py (what a cap costs to compile, by depth): a run's clocks and
phases, the byte cap taken from the uncapped row, the table, and a refused argument. The runs
themselves are the benchmark's (fresh processes, empty caches); here one is made in this
process and the parent's protocol with a stand-in for its child processes."""

from __future__ import annotations

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import cap_compile_bench  # noqa: E402

sys.path.pop(0)


def test_a_run_times_the_first_step_and_its_phases_and_leaves_nothing_patched():
    import aot_partition.memory_models.inductor as inductor_model
    import aot_pipeline.backend as backend

    before = (backend.AotPipelinePartitioner.__call__, inductor_model._lower)
    torch._dynamo.reset()
    row = cap_compile_bench.child("gpt", 1, "ours", None, "cpu")
    assert row["loss_matches_eager"] and row["wall_s"] > 0 and row["cpu_s"] > 0
    assert row["saved_activation_bytes"] > 0
    # our partitioner ran once for the one graph; Inductor compiled its forward and backward
    assert row["phase_calls"]["our partitioner (pricing in it)"] == 1
    assert row["phase_calls"]["Inductor codegen (fw, bw)"] == 2
    assert "pricing: Inductor model lowerings" not in row["phase_calls"]  # no cap: no pricing
    assert (backend.AotPipelinePartitioner.__call__, inductor_model._lower) == before


def test_the_byte_cap_is_half_what_the_uncapped_row_saves_and_the_table_says_the_ratios(
        tmp_path, monkeypatch, capsys):
    asked = []

    def fake_run(model, layers, variant, byte_cap, device, timeout):
        asked.append((variant, byte_cap))
        if variant == "ours-peak":
            return {"model": model, "layers": layers, "variant": variant, "error": "refused"}
        wall = {"inductor": 10.0, "ours": 8.0, "ours-bytes": 12.0}[variant]
        return {"model": model, "layers": layers, "variant": variant, "device": device,
                "wall_s": wall, "cpu_s": wall, "saved_activation_bytes": 1000,
                "loss_matches_eager": True, "phase_calls": {},
                "phases_cpu_s": {"our partitioner (pricing in it)": 1.5}}

    monkeypatch.setattr(cap_compile_bench, "_run", fake_run)
    cap_compile_bench.main(["--models", "gpt", "--layers", "2", "--variants", "inductor", "ours",
                            "ours-bytes", "ours-peak", "--out", str(tmp_path), "--results"])
    assert asked == [("inductor", None), ("ours", None), ("ours-bytes", 500), ("ours-peak", None)]
    table = (tmp_path / "cap_compile_bench.md").read_text()
    assert "| gpt | 2 | 10.0 | - | 8.0 (0.80x) | - | 12.0 (1.20x) | failed |" in table
    assert "| gpt | 2 | ours-peak | - | - | - | - | refused |" in table


def test_a_byte_cap_without_the_uncapped_row_is_refused(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cap_compile_bench.main(["--variants", "ours-bytes", "--out", str(tmp_path)])
    assert exit_.value.code == 2
