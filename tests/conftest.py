import os

import pytest
import torch

# The fresh processes of `aot-pipeline train` and of the benchmarks' smoke runs keep the
# suite's Inductor cache instead of an empty one each (aot_pipeline.train.shared_inductor_cache):
# the tests check what their tables hold, not cold compile times, and the C++ compiler's runs
# of kernels already built were minutes of a cold CI run. test_pipeline_train.py unsets it to
# run the cold path.
os.environ.setdefault("AOT_PIPELINE_SHARED_INDUCTOR_CACHE", "1")

# The heaviest test files first (seconds summed over a file's tests, a cold run on 2 cores,
# 2026-12-07 19:17 UTC, before the shared train cache and the early refusal below the inputs):
# `-n 2 --dist loadfile` hands files out in collection order, so a long file collected last
# keeps one worker busy while the other idles (five minutes of it on CI). Longest first
# balances the two; files not named keep their order after these.
HEAVY_FILES = (
    "aot_pipeline/test_token_split.py",             # 406
    "test_readme_examples.py",                      # 300
    "aot_pipeline/test_pipeline_peak_budget.py",    # 265
    "aot_pipeline/test_pipeline_cli.py",            # 256
    "aot_partition/test_distributed_tp.py",         # 184
    "aot_partition/test_distributed_decisions.py",  # 166
    "aot_pipeline/test_gpu_proof_smoke.py",         # 148
    "aot_pipeline/test_step_cap_vs_torch.py",       # 133
    "aot_pipeline/test_real_models.py",             # 98
    "aot_pipeline/test_pipeline_train.py",          # 93
    "aot_pipeline/test_pipeline_entry_point.py",    # 88
    "aot_pipeline/test_chunkers_bench_smoke.py",    # 84
    "aot_pipeline/test_pipeline_caches.py",         # 75
    "test_ranks.py",                                # 73
    "aot_pipeline/test_trainers.py",                # 62
    "aot_pipeline/test_gpu_train_bench_smoke.py",   # 59
    "aot_pipeline/test_step_cap.py",                # 58
    "aot_partition/test_scalar_codegen.py",         # 55
)


def pytest_configure(config):
    # xdist would sort the files by their number of tests instead (its --loadscope-reorder).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _heaviness(item) -> int:
    path = item.nodeid.split("::")[0].removeprefix("tests/")
    return HEAVY_FILES.index(path) if path in HEAVY_FILES else len(HEAVY_FILES)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_heaviness)  # stable: a file's tests keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
