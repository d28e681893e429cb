"""AOTAutograd (functorch) flags: what torch/_functorch/config.py declares, plus our extras.

Usage::

    from aot_config import functorch as functorch_config

    functorch_config.activation_memory_budget          # 1.0
    with functorch_config.patch(activation_memory_budget=0.5):
        ...
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from aot_config.config_module import flag, install_config_module

if TYPE_CHECKING:
    # ConfigModule's methods (patch, get_hash, ...) as this module's functions, for checkers.
    from aot_config._config_typing import *  # noqa: F403

# ---- RNG, fake tensors, asserts --------------------------------------------------------------

functionalize_rng_ops: bool = flag(
    False,
    doc="Convert torch RNG ops to functional philox equivalents (CUDA RNG ops only).",
)

fake_tensor_allow_meta: bool = flag(
    True,
    env="FAKE_ALLOW_META",
    doc="Allow fake tensors to be created from meta tensors (turn off to debug bad meta fakes).",
)

debug_assert: bool = flag(
    False,
    doc="Enable optional asserts in hot-path code; costs tracing time (aot_eager turns it on).",
)

debug_partitioner: bool = flag(
    False,
    env="AOT_PARTITIONER_DEBUG",
    compile_ignored="debug",
    doc="Log the partitioner's decisions (saved values, bans, recompute choices).",
)

_max_aliased_inputs_with_dynamic_shapes_enabled: int = flag(
    5,
    range=(0, None),
    doc="Error instead of compiling forever when this many inputs falsely alias under dynamic shapes.",
)

static_weight_shapes: bool = flag(
    True,
    doc="Treat parameter and buffer shapes as static even when dynamic shapes are on.",
)

cse: bool = flag(
    True, doc="Apply common-subexpression elimination to the joint graph before partitioning."
)

# A plain GraphModule compiles its Python code when built (0.1 s per 2,500 nodes); compilers that
# read only the graph never need it. Inside torch.compile torch's own lazy modules are used.
lazy_partition_modules: bool = flag(
    True,
    compile_ignored="runtime_behaviour",
    doc="Partitioners return GraphModules that generate their Python code on first use "
        "(call, .code, torch.jit.script), not when built.",
)

# torch 2.13 made this True: parameters and buffers are in memory anyway, so saving them for the
# backward costs no activation memory (the seed's False saved more real activation bytes).
treat_parameters_as_free_to_save: bool = flag(
    True,
    doc="Let the min-cut treat static-lifetime inputs (parameters) as free to save for backward.",
)

# The seed used `not is_fbcode()`; outside Meta's internal build that is True.
view_replay_for_aliased_outputs: bool = flag(
    True,
    doc="Regenerate aliased outputs with functionalization's view replay before as_strided.",
)

# ---- min-cut partitioner heuristics ------------------------------------------------------------

max_dist_from_bw: int = flag(
    1000,
    range=(0, None),
    doc="Ban recomputing nodes farther than this from the backward pass (effectively disabled).",
)

ban_recompute_used_far_apart: bool = flag(
    True, doc="Ban recomputing a node whose users are far apart in the backward pass."
)

ban_recompute_long_fusible_chains: bool = flag(
    True, doc="Break long chains of fusible ops so backward recompute chains stay bounded."
)

ban_recompute_materialized_backward: bool = flag(
    True, doc="Ban recomputing nodes that the backward would materialize in a non-fusible op."
)

ban_recompute_not_in_allowlist: bool = flag(
    True,
    doc="Only recompute allow-listed (cheap) ops; False switches to a block-list (sort, pool, ...).",
)

ban_recompute_reductions: bool = flag(
    True, doc="Ban recomputing reductions: their outputs are small but they are costly in fusions."
)

recompute_views: bool = flag(False, doc="Never save views: always recompute them (views are free).")

aggressive_recomputation: bool = flag(
    False,
    doc="Turn every ban_recompute_* heuristic off except ban_recompute_reductions (saves memory).",
)

min_cut_solver: str = flag(
    "scipy",
    choices=("scipy", "networkx"),
    env="AOT_MIN_CUT_SOLVER",
    doc="Max-flow solver for the min-cut partitioner ('networkx' is the reference).",
)

# ---- activation memory budget --------------------------------------------------------------------

activation_memory_budget: float = flag(
    1.0,
    type=float,
    range=(0.0, 1.0),
    doc="Fraction of the default policy's activation memory to keep: 0 = full recompute, 1 = default.",
)

activation_memory_budget_bytes: int | None = flag(
    None,
    type=int | None,
    range=(0, None),
    doc="Cap on saved activation bytes (parameters excluded); overrides the fraction when set.",
)

activation_memory_budget_best_effort: bool = flag(
    False,
    doc="When a byte cap (activation_memory_budget_bytes or activation_memory_peak_bytes) is "
        "unreachable, take the cut closest to it with a warning instead of raising "
        "UnreachableMemoryBudgetError.",
)

activation_memory_peak_bytes: int | None = flag(
    None,
    type=int | None,
    range=(0, None),
    doc="Cap on the modelled forward+backward peak bytes, inputs and parameters included "
        "(activation_memory_model says which model); None = no cap.",
)

activation_memory_peak_fraction: float | None = flag(
    None,
    type=float | None,
    range=(0.0, 1.0),
    doc="Cap on the modelled forward+backward peak as a fraction of the runtime-optimal cut's "
        "(e.g. 0.8: at most 80% of the peak with no budget); None = no cap. With "
        "activation_memory_peak_bytes set too, both hold.",
)

activation_memory_model: str = flag(
    "auto",
    choices=("auto", "eager", "inductor"),
    doc="The memory model that prices a peak cap and the report's peak: 'inductor' lowers each "
        "candidate's graphs with Inductor (fusion, buffer reuse, its memory plan; no kernel is "
        "compiled), 'eager' simulates the FX graphs op by op (compilers that run them as they "
        "are: nop, debug, TorchScript), 'auto' = 'inductor' when Inductor calls the "
        "partitioner (its custom_partitioner_fn), else 'eager'.",
)

activation_memory_budget_runtime_estimator: str = flag(
    "roofline",
    choices=("flops", "roofline", "profile", "testing"),
    doc="Op runtime estimate for the budget: roofline (FLOPs and bytes moved; ours), FLOPs "
        "(torch's default), benchmarking, or 1 per op ('testing').",
)

activation_memory_budget_reference_estimator: str | None = flag(
    "flops",
    type=str | None,
    choices=(None, "flops", "roofline", "profile", "testing"),
    doc="At a fraction between 0 and 1, also make this estimator's cut and keep ours only if it "
        "is no worse on simulated peak and estimated step time (ours); None = no check.",
)

activation_memory_budget_reference_ilp: bool = flag(
    False,
    doc="In the reference check (solver dp), also try the whole-graph MILP's cut on forwards of "
        "at most 210 MILP nodes: up to 4% shorter estimated steps on small graphs, for "
        "scipy.optimize's import (0.2 s a process) and 10-50 ms a graph.",
)

activation_memory_budget_solver: str = flag(
    "dp",
    choices=("dp", "greedy", "ilp", "ilp_graph", "dp_graph"),
    doc="0-1 knapsack solver for the budget: dp, greedy, ilp (scipy), ilp_graph, dp_graph.",
)

visualize_memory_budget_pareto: bool = flag(
    False,
    env="PARTITIONER_MEMORY_BUDGET_PARETO",
    compile_ignored="debug",
    doc="Draw runtime vs. activation memory for budgets 0..1 (step 0.5) as a PNG.",
)

def _token_split_problem(value: object) -> str | None:
    if value is False or value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return None
    return "expected 'auto', False or a number of chunks >= 1"


activation_token_split: str | int | bool = flag(
    "auto",
    type=str | int | bool,
    validator=_token_split_problem,
    doc="Compute the LM head and its cross-entropy in chunks of tokens (aot_partition.fx."
        "token_split): 'auto' splits only when a peak cap cannot be met otherwise; False "
        "never; a number N >= 2 always, into N chunks (1: never).",
)

memory_budget_pareto_dir: str | None = flag(
    None,
    type=str | None,
    compile_ignored="debug",
    doc="Folder for visualize_memory_budget_pareto's PNGs (created if missing); None: the "
        "working directory.",
)

# ---- many ranks (torch.distributed) ---------------------------------------------------------------

# torch's unsafe_allow_optimization_of_collectives, under a name that says what it allows.
allow_recompute_collectives: bool = flag(
    False,
    doc="Let the partitioner recompute functional collectives (_c10d_functional ops and their "
        "waits) in the backward; off: they are always saved (network traffic, deadlocks).",
)

agree_partition_across_ranks: bool = flag(
    True,
    doc="With more than one rank, make measured ('profile') runtimes and MILP limits the same on "
        "every rank (one all-reduce per compiled graph); off when ranks compile different graphs.",
)

check_partition_agreement: bool = flag(
    False,
    doc="With more than one rank, all-reduce a fingerprint of each saved set and raise, naming "
        "the differing nodes, when the ranks' partitions differ.",
)

def _positive_finite(value: float) -> str | None:
    if not 0 < value < float("inf"):
        return f"must be a positive, finite number of GB/s, got {value!r}"
    return None


collective_bandwidth_gbps: float = flag(
    50.0,
    type=float,
    validator=_positive_finite,
    doc="Network bandwidth in GB/s (1e9 bytes/s) that prices a collective's bytes in the "
        "'profile' and 'roofline' estimators (collectives are never run to time them).",
)

# ---- activation offloading (aot_partition.fx.offload) ---------------------------------------------

enable_activation_offloading: bool = flag(
    False,
    doc="Offload the saved values tagged should_offload (node.meta, torch's tag) to host memory: "
        "copied out on a side stream in the forward, prefetched back in the backward.",
)

activation_offload_planner: bool = flag(
    False,
    doc="The keep / recompute / offload planner (aot_partition.budget.offload_plan) chooses the "
        "cut and the saved values to offload under the fraction, byte or peak budget; "
        "should_offload tags are honoured too. MUST_SAVE values are never offloaded.",
)


def _positive_finite_or_none(value: float | None) -> str | None:
    return None if value is None else _positive_finite(value)


activation_offload_cpu_gpu_bw: float | None = flag(
    None,
    type=float | None,
    validator=_positive_finite_or_none,
    doc="Device<->host bandwidth in GB/s that times offload copies (torch's name); None = the "
        "roofline device table's link (H100: 50 GB/s, PCIe gen5).",
)

activation_offload_device: str = flag(
    "cpu",
    choices=("cpu", "cpu_pageable"),
    doc="Where offloaded activations go: pinned host memory ('cpu': asynchronous copies) or "
        "pageable host memory ('cpu_pageable': no pinned memory used, the copies block more).",
)

# ---- fake tensors and effects ---------------------------------------------------------------------

fake_tensor_allow_unsafe_data_ptr_access: bool = flag(
    True, doc="Allow FakeTensor.data_ptr() instead of erroring (torch.compile turns this off)."
)

unlift_effect_tokens: bool = flag(
    False,
    doc="Insert make_token/sink_token calls in the graph instead of threading effect tokens.",
)

fake_tensor_propagate_real_tensors: bool = flag(
    False,
    doc="Also run real tensors alongside fake ones (resolves item() and checks fake vs. real).",
)

# ---- output and caching -----------------------------------------------------------------------------

torch_compile_graph_format: str = flag(
    "svg",
    env="TORCH_COMPILE_GRAPH_FORMAT",
    compile_ignored="debug",
    doc="Default Graphviz output format for draw_graph (see graphviz.org/docs/outputs).",
)

enable_autograd_cache: bool = flag(
    False,
    env="ENABLE_AOT_AUTOGRAD_CACHE",
    doc="Cache AOTAutograd results across compilations.",
)

strict_autograd_cache: bool = flag(
    False, doc="Raise instead of warning when the AOTAutograd cache is bypassed (for tests)."
)

install_config_module(sys.modules[__name__])
