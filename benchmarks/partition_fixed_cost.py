"""Where one cold partition call spends its time, by stage (issue 28, item 5: the fixed cost).

Same protocol as ``partition_fresh_bench.py`` (a fresh deep copy of the joint, every cache
cleared, ``gc.collect()`` first, median of ``--repeats``); each stage's function is wrapped in
a timer and a stage's time excludes the stages nested in it:

- copy: the deep copy of the joint (outside the timed call, shown for scale);
- prepare: the joint's checks and passes (``prepared_joint``: CSE, RNG functionalization ...);
- classify: node classification and region lookup;
- network: the fx -> flow-network translation (``fx.network.cut_fx_graph`` without the solver);
- solve: the min-cut solver (``core.mincut`` registry's "scipy");
- budget: the rest of the saved-set choice (escalation, knapsack, reference check: its MILP
  and its simulations);
- extract: the forward and backward graphs and their GraphModules;
- report: the partition report, its log line and the trace;
- other: the call's total less all of the above.

    uv run python benchmarks/partition_fixed_cost.py --models mlp gpt gpt2 --budgets 1.0 0.5 0.0
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import aot_partition
import aot_partition.core.mincut as mincut
import aot_partition.fx.solve as fx_solve
import aot_partition.partitioners as partitioners
import partition_fresh_bench as bench
from aot_config import functorch as functorch_config
from torch._subclasses.fake_tensor import unset_fake_temporarily

STAGES = ("copy", "prepare", "classify", "network", "solve", "budget", "extract", "report",
          "other")
_spent: dict[str, float] = defaultdict(float)
_stack: list[str] = []


def _timed(stage: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _stack.append(stage)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            _stack.pop()
            _spent[stage] += elapsed
            if _stack:  # exclusive times: the enclosing stage does not count this one
                _spent[_stack[-1]] -= elapsed
    return wrapper


def _timed_context(stage: str, cm_factory: Any) -> Any:
    """A context manager factory whose enter and exit count as ``stage``."""
    class Timed:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._cm = cm_factory(*args, **kwargs)

        def __enter__(self) -> Any:
            return _timed(stage, self._cm.__enter__)()

        def __exit__(self, *exc: Any) -> Any:
            return _timed(stage, self._cm.__exit__)(*exc)
    return Timed


def install_timers() -> None:
    partitioners.prepared_joint = _timed_context("prepare", partitioners.prepared_joint)
    for name in ("classify", "find_regions"):
        setattr(partitioners, name, _timed("classify", getattr(partitioners, name)))
    fx_solve.cut_fx_graph = _timed("network", fx_solve.cut_fx_graph)
    mincut.SOLVERS["scipy"] = _timed("solve", mincut.get_solver("scipy"))
    partitioners._choose_saved_values = _timed("budget", partitioners._choose_saved_values)
    for name in ("extract_cut", "finish_cut", "make_graph_module"):
        setattr(partitioners, name, _timed("extract", getattr(partitioners, name)))
    for name in ("build_report", "log_report", "trace_partition"):
        setattr(partitioners, name, _timed("report", getattr(partitioners, name)))


def one_call(joint: bench.Joint, budget: float) -> dict[str, float]:
    start = time.perf_counter()
    with unset_fake_temporarily():
        module = copy.deepcopy(joint.module)
    copy_s = time.perf_counter() - start
    bench.clear_process_caches()
    gc.collect()
    _spent.clear()
    with functorch_config.patch(activation_memory_budget=budget):
        start = time.perf_counter()
        aot_partition.min_cut_rematerialization_partition(module, joint.inputs, **joint.kwargs)
        total = time.perf_counter() - start
    spent = {stage: _spent.get(stage, 0.0) for stage in STAGES}
    spent["other"] = total - sum(spent.values())
    spent["copy"] = copy_s
    spent["total"] = total
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "gpt", "gpt2"])
    parser.add_argument("--budgets", nargs="+", type=float, default=[1.0, 0.5, 0.0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import test_real_models as real
    from zoo import ZOO

    joints = (bench.zoo_joints([m for m in args.models if m in ZOO])
              + bench.big_joints([m for m in args.models if m in bench.BIG_MODELS])
              + bench.real_joints([m for m in args.models if m in real.MODELS]))
    install_timers()
    print("| model | nodes | budget | " + " | ".join(STAGES) + " | total (ms) |")
    print("|---|---:|---:|" + "---:|" * (len(STAGES) + 1))
    for joint in joints:
        for budget in args.budgets:
            calls = [one_call(joint, budget) for _ in range(args.repeats)]
            median = {key: statistics.median(c[key] for c in calls) for key in calls[0]}
            cells = " | ".join(f"{median[s] * 1e3:.1f}" for s in STAGES)
            print(f"| {joint.label} | {len(joint.module.graph.nodes)} | {budget} | {cells} | "
                  f"{median['total'] * 1e3:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
