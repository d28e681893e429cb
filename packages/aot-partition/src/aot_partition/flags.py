"""Read partitioner flags from ``aot_config.functorch`` (never from torch's own config).

torch sets ``torch._functorch.config`` internally; the partitioner must honour only our flags.
"""

from __future__ import annotations

import os
from typing import Any

# Fallbacks, same values as seed 000, used only for a flag aot_config does not declare.
DEFAULTS: dict[str, Any] = {
    "cse": True,
    "debug_partitioner": bool(os.environ.get("AOT_PARTITIONER_DEBUG", False)),
    "recompute_views": False,
    "max_dist_from_bw": 1000,
    "ban_recompute_used_far_apart": True,
    "ban_recompute_long_fusible_chains": True,
    "ban_recompute_materialized_backward": True,
    "ban_recompute_not_in_allowlist": True,
    "ban_recompute_reductions": True,
    "aggressive_recomputation": False,
    "activation_memory_budget": 1.0,
    "min_cut_solver": "scipy",
    "treat_parameters_as_free_to_save": False,
}


def read_flag(name: str) -> Any:
    """The current value of functorch flag ``name`` from ``aot_config.functorch``."""
    try:
        from aot_config import functorch as functorch_config
    except ImportError:
        return DEFAULTS[name]
    try:
        return getattr(functorch_config, name)
    except AttributeError:
        if name in DEFAULTS:
            return DEFAULTS[name]
        raise
