"""Writes saved_sets_golden.json: the values our partitioner saves on each zoo model at each
fraction budget (default flags). Regenerate only for an intended change of decisions:

    uv run python tests/aot_partition/data/make_saved_sets_golden.py
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE))]

from test_saved_sets_golden import BUDGETS, saved_names  # noqa: E402
from zoo import ZOO  # noqa: E402

if __name__ == "__main__":
    golden = {name: {str(b): saved_names(name, b) for b in BUDGETS} for name in ZOO}
    with open(os.path.join(HERE, "saved_sets_golden.json"), "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")
