"""``PartitionConfig``: every flag the partitioner reads, frozen once per partition call.

Each decision of the partitioner is a function of (graph, config). ``PartitionConfig.from_flags``
reads ``aot_config.functorch`` (and torch's flags of the same name: flags.py) once, at the
start of a call, so a patch made by another thread,
or one that ends half-way through a partition, cannot change a decision in the middle of it. A
caller that does not use aot_config builds one directly (every field has the flag's default).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from .flags import read_flag

__all__ = ["MinCutOptions", "PartitionConfig", "collective_bandwidth_gbps"]


@dataclass(frozen=True)
class MinCutOptions:
    """Which ban heuristics are on (torch's names)."""

    ban_if_used_far_apart: bool = True
    ban_if_long_fusible_chains: bool = True
    ban_if_materialized_backward: bool = True
    ban_if_not_in_allowlist: bool = True
    ban_if_reduction: bool = True
    # Ours: functional collectives are never recomputed (flag allow_recompute_collectives).
    ban_if_collective: bool = True

    @classmethod
    def from_flags(cls) -> MinCutOptions:
        """Options from ``aot_config.functorch``; aggressive_recomputation turns four off."""
        return cls._from(read_flag)

    @classmethod
    def _from(cls, read: Any) -> MinCutOptions:
        options = cls(**{name: bool(read(flag)) for name, flag in _FLAG_OF_OPTION.items()},
                      ban_if_collective=not read("allow_recompute_collectives"))
        if read("aggressive_recomputation"):
            options = replace(options, ban_if_used_far_apart=False,
                              ban_if_long_fusible_chains=False,
                              ban_if_materialized_backward=False,
                              ban_if_not_in_allowlist=False)
        return options


# MinCutOptions field -> the aot_config.functorch flag it is read from.
_FLAG_OF_OPTION = {
    "ban_if_used_far_apart": "ban_recompute_used_far_apart",
    "ban_if_long_fusible_chains": "ban_recompute_long_fusible_chains",
    "ban_if_materialized_backward": "ban_recompute_materialized_backward",
    "ban_if_not_in_allowlist": "ban_recompute_not_in_allowlist",
    "ban_if_reduction": "ban_recompute_reductions",
}

# PartitionConfig field -> the aot_config.functorch flag it is read from.
_FLAG_OF_FIELD = {
    "recompute_views": "recompute_views",
    "max_dist_from_bw": "max_dist_from_bw",
    "treat_parameters_as_free_to_save": "treat_parameters_as_free_to_save",
    "cse": "cse",
    "lazy_modules": "lazy_partition_modules",
    "min_cut_solver": "min_cut_solver",
    "memory_budget": "activation_memory_budget",
    "memory_budget_bytes": "activation_memory_budget_bytes",
    "peak_bytes": "activation_memory_peak_bytes",
    "peak_fraction": "activation_memory_peak_fraction",
    "memory_model": "activation_memory_model",
    "best_effort": "activation_memory_budget_best_effort",
    "budget_solver": "activation_memory_budget_solver",
    "runtime_estimator": "activation_memory_budget_runtime_estimator",
    "reference_estimator": "activation_memory_budget_reference_estimator",
    "reference_ilp": "activation_memory_budget_reference_ilp",
    "debug": "debug_partitioner",
    "visualize_pareto": "visualize_memory_budget_pareto",
    "pareto_dir": "memory_budget_pareto_dir",
    "graph_format": "torch_compile_graph_format",
    "agree_across_ranks": "agree_partition_across_ranks",
    "check_agreement": "check_partition_agreement",
    "collective_bandwidth_gbps": "collective_bandwidth_gbps",
    "offload_tagged": "enable_activation_offloading",
    "offload_planner": "activation_offload_planner",
    "offload_bandwidth_gbps": "activation_offload_cpu_gpu_bw",
    "offload_device": "activation_offload_device",
}


@dataclass(frozen=True)
class PartitionConfig:
    """The partitioner's settings for one call; defaults are the flags' defaults."""

    options: MinCutOptions = field(default_factory=MinCutOptions)
    recompute_views: bool = False
    max_dist_from_bw: int = 1000
    treat_parameters_as_free_to_save: bool = True
    cse: bool = True
    # The returned modules generate their Python code on first use (graph_modules.py).
    lazy_modules: bool = True
    min_cut_solver: str = "scipy"
    memory_budget: float = 1.0
    memory_budget_bytes: int | None = None
    peak_bytes: int | None = None
    # A cap on the peak as a fraction of the runtime-optimal cut's (under the memory model).
    peak_fraction: float | None = None
    # The model that prices a peak: "inductor", "eager" or "auto" (memory_models/pricing.py).
    memory_model: str = "auto"
    # An unreachable byte cap takes the closest cut with a warning instead of raising.
    best_effort: bool = False
    budget_solver: str = "dp"
    runtime_estimator: str = "roofline"
    # A fraction budget's cut must be no worse than this estimator's (reference.py); None: off.
    reference_estimator: str | None = "flops"
    # The check also tries the whole-graph MILP's cut on small forwards (reference.py): opt-in,
    # its scipy.optimize import alone is 0.2 s of a cold compile.
    reference_ilp: bool = False
    debug: bool = False
    visualize_pareto: bool = False
    pareto_dir: str | None = None
    graph_format: str = "svg"
    # Many ranks (costs/spmd.py): agree on measured runtimes and MILP limits; check the saved sets.
    agree_across_ranks: bool = True
    check_agreement: bool = False
    collective_bandwidth_gbps: float = 50.0
    # Activation offloading (fx/offload.py): torch's should_offload tags, the planner
    # (budget/offload_plan.py, when installed), the host link (None: the device table's).
    offload_tagged: bool = False
    offload_planner: bool = False
    offload_bandwidth_gbps: float | None = None
    offload_device: str = "cpu"

    @property
    def offloading(self) -> bool:
        """Whether a partition may offload saved values at all."""
        return self.offload_tagged or self.offload_planner

    @classmethod
    def from_flags(cls, **overrides: Any) -> PartitionConfig:
        """The current ``aot_config.functorch`` flags (this thread's patches included), with
        ``overrides`` (field names) on top; an unknown override raises TypeError."""
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"PartitionConfig has no field {unknown[0]!r}; valid: "
                            f"{', '.join(f.name for f in fields(cls))}")
        values: dict[str, Any] = {name: read_flag(flag) for name, flag in _FLAG_OF_FIELD.items()}
        values["options"] = MinCutOptions.from_flags()
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> PartitionConfig:
        return replace(self, **changes)

    def as_flags(self) -> dict[str, Any]:
        """These settings by ``aot_config.functorch`` flag name. The ban flags are the
        heuristics in force (``aggressive_recomputation`` has already turned four off)."""
        flags = {flag: getattr(self, name) for name, flag in _FLAG_OF_FIELD.items()}
        flags.update({flag: getattr(self.options, name) for name, flag in _FLAG_OF_OPTION.items()})
        flags["allow_recompute_collectives"] = not self.options.ban_if_collective
        return flags

def collective_bandwidth_gbps() -> float:
    """The flag ``collective_bandwidth_gbps``, read now: the runtime estimators take no config,
    and only the few collective nodes of a graph read it."""
    return float(read_flag("collective_bandwidth_gbps"))
