"""Fingerprints of the partitioner's answers: a refactor that must not change behaviour
compares these before and after (issue 49: the rooms; issue 41: the speed work).

Cells: every joint of partition_fresh_bench.py (the tests/zoo.py models, the real models of
tests/aot_pipeline/test_real_models.py, gpt-matmul-12) at budgets 1.0, 0.8, 0.5, 0.2, 0.0 and
under peak caps at 95% and 80% of the runtime-optimal cut's modelled peak
(``peak_fraction``, eager model). Each cell is the SHA-256 of the forward's and the backward's
generated code, or the error's class and message. Uses only the public API, so the same script
runs on any tree:

    uv run python benchmarks/partition_fingerprints.py --out before.json
    uv run python benchmarks/partition_fingerprints.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import partition_fresh_bench as bench  # noqa: E402
from aot_partition import PartitionConfig, min_cut_rematerialization_partition  # noqa: E402

BUDGETS = (1.0, 0.8, 0.5, 0.2, 0.0)
PEAK_FRACTIONS = (0.95, 0.8)


def cell(joint: bench.Joint, config: PartitionConfig) -> str:
    try:
        fw, bw = min_cut_rematerialization_partition(
            joint.fresh(), joint.inputs, config=config, **joint.kwargs)
    except Exception as error:  # the answer may be a refusal: that is fingerprinted too
        return f"{type(error).__name__}: {error}"
    return hashlib.sha256((fw.code + "\n----\n" + bw.code).encode()).hexdigest()


def fingerprints(models: list[str]) -> dict[str, str]:
    import test_real_models as real
    from zoo import ZOO

    joints = []
    if "zoo" in models:
        joints += bench.zoo_joints(list(ZOO))
    if "real" in models:
        joints += bench.real_joints(list(real.MODELS))
    joints += bench.big_joints([m for m in models if m in bench.BIG_MODELS])
    out: dict[str, str] = {}
    for joint in joints:
        for budget in BUDGETS:
            out[f"{joint.label} @{budget}"] = cell(joint, PartitionConfig(memory_budget=budget))
        for fraction in PEAK_FRACTIONS:
            out[f"{joint.label} peak {fraction}"] = cell(
                joint, PartitionConfig(peak_fraction=fraction, memory_model="eager"))
        print(f"{joint.label}: {len(BUDGETS) + len(PEAK_FRACTIONS)} cells", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["zoo", "real", "gpt-matmul-12"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="an earlier --out file: list the cells that differ")
    args = parser.parse_args(argv)
    found = fingerprints(args.models)
    with open(args.out, "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)
    print(f"{len(found)} cells -> {args.out}")
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        differ = sorted(k for k in before.keys() | found.keys() if before.get(k) != found.get(k))
        print(f"{len(differ)} of {len(found)} cells differ" + "".join(f"\n  {k}" for k in differ))
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
