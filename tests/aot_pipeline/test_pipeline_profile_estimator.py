"""The "profile" runtime estimator inside torch.compile, where the partitioner runs under
AOTAutograd's FakeTensorMode: it must time real kernels (it used to run them on fake tensors
and crash the process) and train like eager, dropout included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# In a child process: a regression is a segfault, which must not take the test session along.
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import aot_pipeline
from aot_config import functorch as functorch_flags
from aot_partition.fx import estimators
from zoo import assert_matches_eager, make_case

timed = []
run_and_time = estimators._run_and_time

def counting(node, on_cuda):
    ms = run_and_time(node, on_cuda)  # raises where the estimator falls back to roofline
    timed.append(node.name)
    return ms

estimators._run_and_time = counting
with functorch_flags.patch(activation_memory_budget_runtime_estimator="profile"):
    for name in sys.argv[2:]:
        assert_matches_eager(make_case(name), lambda module: aot_pipeline.compile(
            module, memory_budget=0.5, compiler="nop"))
print(len(timed))
"""


@pytest.mark.parametrize("models", [("gpt", "dropout")])
def test_profile_estimator_times_real_kernels_inside_torch_compile(models):
    child = subprocess.run([sys.executable, "-c", CHILD, TESTS, *models], capture_output=True,
                           text=True, timeout=600, check=False)
    assert child.returncode == 0, (child.returncode, child.stderr[-3000:])
    assert int(child.stdout.split()[-1]) > 0  # ops were timed, not all left to the fallback
