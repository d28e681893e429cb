"""Inductor's FX graph cache and AOTAutograd's cache with ``backend="aot_pipeline"``.

Two processes share a fresh ``TORCHINDUCTOR_CACHE_DIR``: the first compiles (misses, saves),
the second hits with no bypass, then misses once our partitioner's options, flags or sources
change, so a stale entry is never used. Nothing may log a pickling failure.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
from aot_pipeline.backend import AotPipelinePartitioner, partitioner_cache_key

# Each run: dynamo reset, counters cleared, a tiny MLP compiled and one training step.
CHILD = r"""
import json, sys, time

import torch
from torch import nn
from torch._dynamo.utils import counters

import aot_pipeline.backend as backend
from aot_config import functorch as flags

results = []
for run in json.loads(sys.argv[1]):
    torch._dynamo.reset()
    counters.clear()
    if "sources" in run:  # as if the partitioner's sources were edited
        backend._sources_digest = lambda: run["sources"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    if run.get("api") == "compile":  # aot_pipeline.compile with the caches kept on
        import aot_pipeline

        compiled = aot_pipeline.compile(model, memory_budget=run.get("memory_budget", 1.0),
                                        record_partitions=run["record_partitions"])
    else:
        compiled = torch.compile(model, backend="aot_pipeline",
                                 options={"memory_budget": run.get("memory_budget", 1.0)})
    with flags.patch(run.get("flags", {})):
        start = time.perf_counter()
        compiled(torch.randn(4, 16)).sum().backward()
        seconds = time.perf_counter() - start
    results.append({
        "inductor": {k: v for k, v in counters["inductor"].items()
                     if k.startswith("fxgraph_cache")},
        "aot_autograd": {k: v for k, v in counters["aot_autograd"].items()
                         if k.startswith("autograd_cache")},
        "first_step_s": seconds,
        "partitions": len(getattr(compiled, "partitions", ())),
    })
print("RESULTS " + json.dumps(results))
"""


def _run_child(tmp_path, runs: list[dict]) -> tuple[list[dict], str]:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")
    for name in ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
                 "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        env.pop(name, None)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), json.dumps(runs)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS ")), proc.stderr


def _counts(result: dict) -> tuple[int, int, int, int, int, int]:
    fx, aot = result["inductor"], result["aot_autograd"]
    return (fx.get("fxgraph_cache_hit", 0), fx.get("fxgraph_cache_miss", 0),
            fx.get("fxgraph_cache_bypass", 0), aot.get("autograd_cache_hit", 0),
            aot.get("autograd_cache_miss", 0), aot.get("autograd_cache_bypass", 0))


@pytest.mark.slow
def test_second_process_hits_and_changed_partitioner_misses(tmp_path):
    (cold,), stderr = _run_child(tmp_path, [{}])
    assert "Failed to pickle" not in stderr
    fx_hit, fx_miss, fx_bypass, aot_hit, aot_miss, aot_bypass = _counts(cold)
    assert (fx_hit, fx_bypass, aot_hit, aot_bypass) == (0, 0, 0, 0), cold
    assert fx_miss == 2 and aot_miss == 1, cold  # forward and backward; one joint graph
    assert cold["aot_autograd"].get("autograd_cache_saved") == 1, cold

    warm, budget, flag, sources = (
        _run_child(tmp_path, [{}, {"memory_budget": 0.5}, {"flags": {"recompute_views": True}},
                              {"sources": "edited"}]))[0]
    fx_hit, fx_miss, fx_bypass, aot_hit, aot_miss, aot_bypass = _counts(warm)
    assert aot_hit == 1 and (aot_miss, aot_bypass) == (0, 0), warm
    # An AOTAutograd hit loads the compiled forward and backward from Inductor's cache.
    assert fx_hit == 2 and (fx_miss, fx_bypass) == (0, 0), warm
    for changed in (budget, flag, sources):
        fx_hit, fx_miss, fx_bypass, aot_hit, aot_miss, aot_bypass = _counts(changed)
        assert (aot_hit, aot_bypass, fx_hit, fx_bypass) == (0, 0, 0, 0), changed
        assert aot_miss == 1 and fx_miss == 2, changed
    print(f"first step: cold {cold['first_step_s']:.2f} s, warm {warm['first_step_s']:.2f} s")


@pytest.mark.slow
def test_compile_api_uses_the_caches_unless_it_records_partitions(tmp_path):
    cached = {"api": "compile", "record_partitions": False}
    recorded = {"api": "compile", "record_partitions": True}
    (cold,), _ = _run_child(tmp_path, [cached])
    assert _counts(cold)[3:5] == (0, 1) and cold["partitions"] == 1, cold
    (warm, again), _ = _run_child(tmp_path, [cached, recorded])
    # Warm: AOTAutograd loads forward and backward from the cache; the partitioner never ran.
    assert _counts(warm) == (2, 0, 0, 1, 0, 0) and warm["partitions"] == 0, warm
    # Recording turns the FX graph cache off, so AOTAutograd's is bypassed too: the graph is
    # partitioned (and listed) again.
    assert _counts(again) == (0, 0, 0, 0, 0, 1) and again["partitions"] == 1, again


def test_partitioner_pickles_to_its_cache_key():
    partitioner = AotPipelinePartitioner(0.5, "dp")
    again = pickle.loads(pickle.dumps(partitioner))
    assert isinstance(again, AotPipelinePartitioner)
    assert again.uuid() == partitioner.uuid()
    assert pickle.dumps(again) == pickle.dumps(partitioner)
    assert pickle.dumps(AotPipelinePartitioner(0.4, "dp")) != pickle.dumps(partitioner)


def test_partitioner_key_follows_options_flags_and_sources(monkeypatch):
    import aot_pipeline.backend as backend
    from aot_config import functorch as flags

    key = partitioner_cache_key(1.0, "dp")
    assert partitioner_cache_key(1.0, "dp") == key
    assert partitioner_cache_key(0.5, "dp") != key
    assert partitioner_cache_key(1.0, "greedy") != key
    with flags.patch(recompute_views=not flags.recompute_views):
        assert partitioner_cache_key(1.0, "dp") != key
    # Budget and solver flags are overridden by the options: they do not split the cache.
    with flags.patch(activation_memory_budget=0.25, activation_memory_budget_solver="greedy"):
        assert partitioner_cache_key(1.0, "dp") == key
    monkeypatch.setattr(backend, "_sources_digest", lambda: "edited")
    assert partitioner_cache_key(1.0, "dp") != key


def test_partitioner_in_inductor_config_hashes_without_pickle_errors():
    import torch
    from torch._inductor import config
    from torch._inductor.codecache import FxGraphCachePickler

    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    hashes = []
    for budget in (1.0, 1.0, 0.5):
        with config.patch(custom_partitioner_fn=AotPipelinePartitioner(budget, "dp")):
            portable = config.save_config_portable(ignore_private_configs=False,
                                                   readonly_values=True)
            hashes.append(FxGraphCachePickler(gm).get_hash(portable))
    assert hashes[0] == hashes[1] != hashes[2]
