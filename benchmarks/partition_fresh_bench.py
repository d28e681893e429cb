"""Partition time, ours against torch's, one cold call at a time (issue 28, item 5).

Protocol: each timing is one call on a fresh deep copy of the joint (the copy is not timed),
with nothing carried over from an earlier call: every ``functools`` cache of ``aot_partition``
and of torch's partitioner is cleared first, and ``gc.collect()`` runs before the clock starts.
Median of ``--repeats`` (3) calls; torch's ``min_cut_rematerialization_partition`` runs in the
same process on the same joint, interleaved with ours (ours, torch, ours, torch, ...), so machine
noise hits both sides alike. Both run with their own defaults (ours: the "roofline" runtime
estimator; torch: "flops"); ``--estimator flops`` gives ours torch's estimator, as
``partition_bench.py`` does. ``--warm`` keeps the caches between calls (as a loop of calls in
one process would).

Joints: the tests/zoo.py models (captured with ``aot_module``) and the real models of
tests/aot_pipeline/test_real_models.py (captured the way that file does: the joints
``torch.compile(backend="aot_pipeline")`` hands to our partitioner; a model with graph breaks
gives several joints, each timed on its own).

Writes ``benchmarks/out/partition_fresh_bench.json`` and ``.md`` (sorted slowest ratio first;
ratio = torch seconds / ours seconds, above 1: ours is faster), and with ``--results`` the
summary to ``benchmarks/RESULTS-partition-fresh.md``.

    uv run python benchmarks/partition_fresh_bench.py --models zoo
    uv run python benchmarks/partition_fresh_bench.py --models real --budgets 0.5
    uv run python benchmarks/partition_fresh_bench.py --models gpt-32 --budgets 1.0 0.5
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.fx as fx
from aot_config import functorch as functorch_config
from functorch.compile import aot_module, make_boxed_func
from torch._functorch import config as torch_config
from torch._functorch import partitioners as torch_partitioners
from torch._subclasses.fake_tensor import unset_fake_temporarily

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "aot_pipeline")]

import aot_partition  # noqa: E402

BUDGETS = (1.0, 0.8, 0.5, 0.2, 0.0)
# The built-in GPT (attention written as matmuls) at depth: issue 28's GPT-32, and 12 layers.
BIG_MODELS: dict[str, dict[str, Any]] = {"gpt-32": {"name": "gpt", "layers": 32},
                                         "gpt-matmul-12": {"name": "gpt", "layers": 12}}


@dataclass
class Joint:
    label: str
    module: fx.GraphModule
    inputs: Any
    kwargs: dict[str, Any]

    def fresh(self) -> fx.GraphModule:
        with unset_fake_temporarily():  # the joint may hold real tensor constants
            return copy.deepcopy(self.module)


@dataclass
class Row:
    model: str
    nodes: int
    budget: float
    ours_s: float
    torch_s: float
    ratio: float  # torch / ours: above 1, ours is faster
    ours_all: list[float]
    torch_all: list[float]
    saved: list[str]  # the values ours saves (compare runs: speed work must not change them)


def _caches_in(module: Any) -> Iterator[Callable[[], None]]:
    for value in vars(module).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            yield clear


# Module-level dicts that memoize per op or per signature across calls (a cold process starts
# with them empty): runtime estimates, kernel workspaces, op packets, CSE's per-target answers.
PROCESS_DICTS = (("aot_partition.costs.estimators", "_cache"), ("aot_partition.memory_models.simulator", "_workspace_cache"),
                 ("aot_partition.fx.joint", "_PACKETS"),
                 ("aot_partition.fx.passes.cse", "_NEVER_MERGED_TARGETS"),
                 ("aot_partition.fx.passes.cse", "_SEEDED_TARGETS"))


def clear_process_caches() -> int:
    """Clears every functools cache of aot_partition and torch's partitioner modules, and the
    memo dicts of ``PROCESS_DICTS``."""
    cleared = 0
    for module_name, attribute in PROCESS_DICTS:
        memo = getattr(sys.modules.get(module_name), attribute, None)
        if isinstance(memo, dict):
            memo.clear()
            cleared += 1
    prefixes = ("aot_partition", "torch._functorch.partitioners",
                "torch._functorch._activation_checkpointing")
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(prefixes):
            for clear in _caches_in(module):
                clear()
                cleared += 1
    return cleared


# --- capturing joints -----------------------------------------------------------------------


def zoo_joints(names: list[str]) -> list[Joint]:
    from zoo import ZOO

    joints = []
    for name in names:
        case = ZOO[name]()
        joints.append(_aot_module_joint(name, case.module, case.inputs))
    return joints


def big_joints(names: list[str]) -> list[Joint]:
    from aot_pipeline.models import build_model

    joints = []
    for name in names:
        spec = dict(BIG_MODELS[name])
        built = build_model(spec.pop("name"), **spec)
        joints.append(_aot_module_joint(name, built.module, built.make_inputs()))
    return joints


def _aot_module_joint(label: str, module: torch.nn.Module, inputs: Any) -> Joint:
    record: list[Joint] = []

    def recording(joint, joint_inputs, **kwargs):
        record.append(Joint(label, copy.deepcopy(joint), joint_inputs, dict(kwargs)))
        return torch_partitioners.default_partition(joint, joint_inputs, **kwargs)

    aot_module(module, fw_compiler=lambda g, _: make_boxed_func(g),
               bw_compiler=lambda g, _: make_boxed_func(g), partition_fn=recording)(*inputs)
    return record[0]


def real_joints(names: list[str]) -> list[Joint]:
    import test_real_models as real

    joints: list[Joint] = []
    ours = aot_partition.min_cut_rematerialization_partition
    for name in names:
        found: list[Joint] = []

        def recording(joint, joint_inputs, *args, _found=found, _name=name, **kwargs):
            with unset_fake_temporarily():
                _found.append(Joint(_name, copy.deepcopy(joint), joint_inputs, dict(kwargs)))
            return ours(joint, joint_inputs, *args, **kwargs)

        torch._dynamo.reset()
        aot_partition.min_cut_rematerialization_partition = recording  # type: ignore[assignment]
        try:
            case = real.build(name)
            compiled = torch.compile(case.module, backend="aot_pipeline",
                                     options={"memory_budget": 1.0, "compiler": "nop"})
            real.run_step(case.module, case.kwargs, call=compiled)
        finally:
            aot_partition.min_cut_rematerialization_partition = ours  # type: ignore[assignment]
            torch._dynamo.reset()
        for index, joint in enumerate(found):
            if len(found) > 1:
                joint.label = f"{name}#{index}"
            joints.append(joint)
    return joints


# --- timing ---------------------------------------------------------------------------------


def _one_call(joint: Joint, budget: float, who: str, estimator: str | None,
              warm: bool, saved: list[str] | None = None) -> float:
    module = joint.fresh()
    if not warm:
        clear_process_caches()
    gc.collect()
    if who == "torch":
        with torch_config.patch(activation_memory_budget=budget):
            start = time.perf_counter()
            torch_partitioners.min_cut_rematerialization_partition(
                module, joint.inputs, **joint.kwargs)
    else:
        flags: dict[str, Any] = {"activation_memory_budget": budget}
        if estimator is not None:
            flags["activation_memory_budget_runtime_estimator"] = estimator
        with functorch_config.patch(**flags):
            start = time.perf_counter()
            fw, _ = aot_partition.min_cut_rematerialization_partition(
                module, joint.inputs, **joint.kwargs)
        seconds = time.perf_counter() - start
        if saved is not None:
            output = next(iter(fw.graph.find_nodes(op="output")))
            saved[:] = [str(v) for v in list(output.args[0])[joint.kwargs["num_fwd_outputs"]:]]
        return seconds
    return time.perf_counter() - start


def time_joint(joint: Joint, budget: float, repeats: int, estimator: str | None,
               warm: bool) -> Row:
    ours: list[float] = []
    theirs: list[float] = []
    saved: list[str] = []
    for _ in range(repeats):
        ours.append(_one_call(joint, budget, "ours", estimator, warm, saved))
        theirs.append(_one_call(joint, budget, "torch", estimator, warm))
    ours_s, torch_s = statistics.median(ours), statistics.median(theirs)
    return Row(joint.label, len(joint.module.graph.nodes), budget, ours_s, torch_s,
               torch_s / ours_s, ours, theirs, saved)


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        f"Date: {meta['date']}; machine: {meta['machine']}; torch {meta['torch']}; "
        f"ours' estimator: {meta['estimator']}; caches: {'kept' if meta['warm'] else 'cleared'}; "
        f"median of {meta['repeats']} fresh-copy calls, ours and torch interleaved.",
        "",
        "| model | nodes | budget | ours ms | torch ms | torch/ours |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: r.ratio):
        lines.append(f"| {row.model} | {row.nodes} | {row.budget} | {row.ours_s * 1e3:.1f} | "
                     f"{row.torch_s * 1e3:.1f} | {row.ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["zoo", "real"],
                        help="zoo, real, gpt-32, or single model names of either set")
    parser.add_argument("--budgets", nargs="+", type=float, default=list(BUDGETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--estimator", default=None,
                        help="ours' runtime estimator (default: our default, roofline)")
    parser.add_argument("--warm", action="store_true", help="keep caches between calls")
    parser.add_argument("--tag", default="", help="suffix of the output file names")
    parser.add_argument("--results", action="store_true",
                        help="also write benchmarks/RESULTS-partition-fresh.md")
    parser.add_argument("--results-from", nargs="+", default=None, metavar="JSON",
                        help="only write RESULTS-partition-fresh.md/.json from these runs' JSON")
    args = parser.parse_args(argv)
    if args.results_from:
        print(write_results(args.results_from))
        return 0

    import test_real_models as real
    from zoo import ZOO

    zoo_names = [m for m in args.models if m in ZOO] + (list(ZOO) if "zoo" in args.models else [])
    real_names = [m for m in args.models if m in real.MODELS] + (
        list(real.MODELS) if "real" in args.models else [])
    big_names = [m for m in args.models if m in BIG_MODELS]
    unknown = [m for m in args.models if m not in ("zoo", "real", *ZOO, *real.MODELS, *BIG_MODELS)]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; valid: zoo, real, "
                     f"{', '.join([*ZOO, *real.MODELS, *BIG_MODELS])}")
    joints = zoo_joints(zoo_names) + big_joints(big_names) + real_joints(real_names)

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores (shared), {platform.system()}",
        "torch": torch.__version__,
        "estimator": args.estimator or "roofline (default)",
        "warm": args.warm,
        "repeats": args.repeats,
        "load": f"{os.getloadavg()[0]:.1f} at the start",
    }
    rows: list[Row] = []
    for joint in joints:
        for budget in args.budgets:
            row = time_joint(joint, budget, args.repeats, args.estimator, args.warm)
            print(f"{row.model:28s} {row.nodes:6d} {budget:4.2f} ours {row.ours_s * 1e3:8.1f} ms "
                  f"torch {row.torch_s * 1e3:8.1f} ms  {row.ratio:5.2f}x", flush=True)
            rows.append(row)
        text = write_outputs(rows, meta, args.tag, args.results)  # after each joint: partial
    print(text)
    return 0


RESULTS_HEADER = """# Partition time, one cold call: torch / ours (issue 28, item 5)

Date: {date}; machine: {machine}, load average {load} (milliseconds grow several times on a
loaded machine: compare the ratios, each measured side by side); torch {torch}.

Protocol (`benchmarks/partition_fresh_bench.py`): each timing is one call on a fresh deep copy
of the joint (copy not timed); before every call the functools caches of aot_partition and of
torch's partitioner and aot_partition's memo dicts are cleared and `gc.collect()` runs; median
of 3; torch's `min_cut_rematerialization_partition` runs in the same process on the same joint,
interleaved with ours. Both use their defaults (ours: `roofline` estimator with the reference
check). Joints: tests/zoo.py (captured with `aot_module`), the real models of
tests/aot_pipeline/test_real_models.py (the joints `torch.compile(backend="aot_pipeline")` hands
the partitioner; `#i` = i-th graph of a model with graph breaks), GPT-32 (5,062 nodes) and
gpt-matmul-12 (the built-in GPT at 12 layers, attention as matmuls, 1,922 nodes).
Ratio = torch ms / ours ms (below 1: ours is slower). Slowest ratio first. Raw rows:
`RESULTS-partition-fresh.json`.
"""


def write_results(paths: list[str]) -> str:
    """RESULTS-partition-fresh.md (the header, the table, the notes) and .json from the JSON
    files of earlier runs; a row measured again in a later file replaces the earlier one."""
    rows: dict[tuple[str, int, float], dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        meta = meta or data["meta"]
        # runs before the load was recorded: 23:05-23:27 UTC on 2026-11-25, read from uptime
        meta.setdefault("load", "0.1-1.2")
        for row in data["rows"]:
            rows[(row["model"], row["nodes"], row["budget"])] = row  # zoo and real "llama"
    ordered = sorted(rows.values(), key=lambda r: r["ratio"])
    lines = [RESULTS_HEADER.format(**meta),
             "| model | nodes | budget | ours ms | torch ms | torch/ours |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['nodes']} | {r['budget']} | {r['ours_s'] * 1e3:.1f} | "
              f"{r['torch_s'] * 1e3:.1f} | {r['ratio']:.2f}x |" for r in ordered]
    notes_path = os.path.join(HERE, "RESULTS-partition-fresh.notes.md")
    if os.path.exists(notes_path):
        with open(notes_path) as f:
            lines += ["", f.read().rstrip()]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(HERE, "RESULTS-partition-fresh.md"), "w") as f:
        f.write(text)
    with open(os.path.join(HERE, "RESULTS-partition-fresh.json"), "w") as f:
        rows_text = ",\n".join(json.dumps(r) for r in ordered)  # one row a line
        f.write(f'{{"meta": {json.dumps(meta)},\n "rows": [\n{rows_text}\n]}}\n')
    return text


def write_outputs(rows: list[Row], meta: dict[str, Any], tag: str, results: bool) -> str:
    out_dir = os.path.join(HERE, "out")
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"partition_fresh_bench{tag}")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
    text = markdown(rows, meta)
    with open(stem + ".md", "w") as f:
        f.write(text)
    if results:
        with open(os.path.join(HERE, "RESULTS-partition-fresh.md"), "w") as f:
            f.write("# Partition time, one cold call (torch / ours)\n\n" + text)
    return text


if __name__ == "__main__":
    sys.exit(main())
