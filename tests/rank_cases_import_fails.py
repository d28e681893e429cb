"""A target module rank 1 cannot import (tests/test_ranks.py: a rank that never starts)."""

import os

from rank_cases import all_reduce_rank  # noqa: F401 - the target, on the ranks that import

if os.environ.get("RANK") == "1":
    raise ImportError("rank 1 cannot import me")
