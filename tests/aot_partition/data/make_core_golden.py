"""Write ``core_golden.json``: what the min-cut partitioner decides on every zoo model.

For each ``tests/zoo.py`` model and activation-memory budget in {1.0, 0.5, 0.0} it records the
saved node names, the saved bytes and the bans (node -> reason) of the chosen cut, as
``partition_with_report`` reports them. ``test_core_fx_adapter.py`` compares today's code with
this file: the fx path must decide exactly what it decided before the graph-agnostic core.

The committed file was generated with the code of git rev 4bf4f02 (before issue 15's core)::

    git worktree add /tmp/aot-4bf4f02 4bf4f02
    PYTHONPATH=$(ls -d /tmp/aot-4bf4f02/packages/*/src | paste -sd:):tests \\
        uv run python tests/aot_partition/data/make_core_golden.py
    git worktree remove /tmp/aot-4bf4f02

Regenerated from the current code after issue 16 made scipy's max-flow return networkx's cut
where cuts tie (the largest source side, as torch's partitioner gets it): at budget 1.0 the
saved nodes became torch's on the convnet, dropout and gpt models. The decisions are recorded
under torch's runtime estimator ("flops"; ours defaults to "roofline" since issue 16).
Regenerated again when attention ops at ``dropout_p=0`` stopped counting as random (they draw
nothing, so recomputing them needs no 5,056-byte CPU RNG state): only ``gpt_sdpa`` changed, at
0.5 (47,232 -> 46,848 saved bytes) and 0.0 (41,216 -> 29,568).

Run it without the PYTHONPATH to regenerate from the current code (only when a decision change
is intended; say so in the commit). ``CORE_GOLDEN_OUT=/tmp/x.json`` writes elsewhere, to diff.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))             # tests/ (zoo.py)
sys.path.insert(0, str(HERE.parent))                 # tests/aot_partition (conftest.py)

import aot_partition  # noqa: E402
import torch  # noqa: E402
from aot_config import functorch as functorch_config  # noqa: E402
from aot_partition.partitioners import partition_with_report  # noqa: E402
from conftest import capture_joint  # noqa: E402
from zoo import ZOO, make_case  # noqa: E402

BUDGETS = (1.0, 0.5, 0.0)
OUT = Path(os.environ.get("CORE_GOLDEN_OUT", HERE / "core_golden.json"))


def case_inputs(case: Any) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in case.inputs)


def decisions(name: str) -> dict[str, Any]:
    """budget -> {saved, saved_bytes, banned} for zoo model ``name``."""
    case = make_case(name)
    joint = capture_joint(case.module, *case_inputs(case))
    found = {}
    for budget in BUDGETS:
        with functorch_config.patch(activation_memory_budget_runtime_estimator="flops"):
            _, _, report = partition_with_report(
                joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs, memory_budget=budget)
        found[str(budget)] = {
            "saved": [d.name for d in report.saved],
            "saved_bytes": report.saved_bytes,
            "banned": dict(report.banned),
        }
    return found


def main() -> None:
    print("aot_partition from", Path(aot_partition.__file__).parent, file=sys.stderr)
    golden = {name: decisions(name) for name in sorted(ZOO)}
    OUT.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
