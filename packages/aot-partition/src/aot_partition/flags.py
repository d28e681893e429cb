"""Read partitioner flags: ``aot_config.functorch``, and torch's own flags of the same name.

Frameworks set torch's flags (``torch._functorch.config.activation_memory_budget = 0.5``), so
for every flag in ``TORCH_MIRRORED_FLAGS`` (same name and meaning in both, and it changes a
partition decision) ``read_flag`` honours torch's value too:

- torch's flag at its default: ours is used (whatever it is);
- torch's flag set and ours at its default: torch's is used (logged at INFO);
- both set, to equal values: that value; to different values: ``FlagConflictError`` naming
  both (neither intent can be assumed, and a wrong budget is a silent memory regression).

This holds for every partition (``torch.compile(backend="aot_pipeline")`` and a standalone
``partition_fn`` of a foreign ``aot_function`` alike): torch's config is where users set these.
A torch value ours cannot take (e.g. a solver we do not have) raises ``FlagConflictError`` too.
Only ``config.py`` calls ``read_flag``: a partition reads the flags once, into a
``PartitionConfig``, and every decision after that reads the config.
"""

from __future__ import annotations

import logging
from typing import Any

from aot_config import functorch as functorch_config

from .errors import FlagConflictError

log = logging.getLogger(__name__)

__all__ = ["TORCH_MIRRORED_FLAGS", "read_flag", "torch_flag_override"]

# torch._functorch.config flags that aot_config.functorch mirrors and that change what a
# partition saves. Not here: flags only torch has, ours only (min_cut_solver, byte caps, the
# reference estimator) and output-only ones only we have (debug_partitioner).
TORCH_MIRRORED_FLAGS: tuple[str, ...] = (
    "activation_memory_budget",
    "activation_memory_budget_runtime_estimator",
    "activation_memory_budget_solver",
    "aggressive_recomputation",
    "ban_recompute_long_fusible_chains",
    "ban_recompute_materialized_backward",
    "ban_recompute_not_in_allowlist",
    "ban_recompute_reductions",
    "ban_recompute_used_far_apart",
    "activation_offload_cpu_gpu_bw",
    "cse",
    "enable_activation_offloading",
    "max_dist_from_bw",
    "recompute_views",
    "treat_parameters_as_free_to_save",
    # output only, but set by frameworks (torchtitan's memory_budget mode): honoured too
    "visualize_memory_budget_pareto",
    "memory_budget_pareto_dir",
)


def torch_flag_override(name: str) -> tuple[bool, Any]:
    """(whether torch's flag ``name`` is set away from torch's default, its value)."""
    import torch._functorch.config as torch_config

    if not hasattr(torch_config, name):  # an older torch without it: nothing to honour
        return False, None
    value = getattr(torch_config, name)
    # By value: a patch that ends re-assigns the old value, which torch then no longer calls
    # "default" (its _is_default), though nothing is set.
    entry = getattr(torch_config, "_config", {}).get(name)
    default = entry.default if entry is not None else getattr(functorch_config, name)
    return value != default, value


def read_flag(name: str) -> Any:
    """The value a partition uses for flag ``name`` (see the module doc); AttributeError names
    the closest flag, FlagConflictError a conflict between torch's flag and ours."""
    ours = getattr(functorch_config, name)
    if name not in TORCH_MIRRORED_FLAGS:
        return ours
    torch_set, torch_value = torch_flag_override(name)
    if not torch_set or torch_value == ours:
        return ours
    if not functorch_config.is_default(name):
        raise FlagConflictError(name, torch_value, ours)
    try:
        checked = functorch_config.flags()[name].check(torch_value)
    except (TypeError, ValueError) as exc:
        raise FlagConflictError(name, torch_value, ours, f"aot_partition cannot use it: {exc}"
                                ) from None
    log.info("using torch._functorch.config.%s = %r (aot_config.functorch.%s is at its "
             "default %r)", name, torch_value, name, ours)
    return checked
