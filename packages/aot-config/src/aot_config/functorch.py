"""AOTAutograd (functorch) flags: what torch/_functorch/config.py declares, plus our extras.

Usage::

    from aot_config import functorch as functorch_config

    functorch_config.activation_memory_budget          # 1.0
    with functorch_config.patch(activation_memory_budget=0.5):
        ...
"""

from __future__ import annotations

import sys

from aot_config.config_module import Flag, install_config_module

# ---- RNG, fake tensors, asserts --------------------------------------------------------------

functionalize_rng_ops = Flag(
    False,
    doc="Convert torch RNG ops to functional philox equivalents (CUDA RNG ops only).",
)

fake_tensor_allow_meta = Flag(
    True,
    env="FAKE_ALLOW_META",
    doc="Allow fake tensors to be created from meta tensors (turn off to debug bad meta fakes).",
)

debug_assert = Flag(
    False,
    doc="Enable optional asserts in hot-path code; costs tracing time (aot_eager turns it on).",
)

debug_partitioner = Flag(
    False,
    env="AOT_PARTITIONER_DEBUG",
    compile_ignored="debug",
    doc="Log the partitioner's decisions (saved values, bans, recompute choices).",
)

_max_aliased_inputs_with_dynamic_shapes_enabled = Flag(
    5,
    range=(0, None),
    doc="Error instead of compiling forever when this many inputs falsely alias under dynamic shapes.",
)

static_weight_shapes = Flag(
    True,
    doc="Treat parameter and buffer shapes as static even when dynamic shapes are on.",
)

cse = Flag(
    True, doc="Apply common-subexpression elimination to the joint graph before partitioning."
)

# Newer torch (2.13) adds this flag with default True; the seed's behaviour is False, kept here.
treat_parameters_as_free_to_save = Flag(
    False,
    doc="Let the min-cut treat static-lifetime inputs (parameters) as free to save for backward.",
)

# The seed used `not is_fbcode()`; outside Meta's internal build that is True.
view_replay_for_aliased_outputs = Flag(
    True,
    doc="Regenerate aliased outputs with functionalization's view replay before as_strided.",
)

# ---- min-cut partitioner heuristics ------------------------------------------------------------

max_dist_from_bw = Flag(
    1000,
    range=(0, None),
    doc="Ban recomputing nodes farther than this from the backward pass (effectively disabled).",
)

ban_recompute_used_far_apart = Flag(
    True, doc="Ban recomputing a node whose users are far apart in the backward pass."
)

ban_recompute_long_fusible_chains = Flag(
    True, doc="Break long chains of fusible ops so backward recompute chains stay bounded."
)

ban_recompute_materialized_backward = Flag(
    True, doc="Ban recomputing nodes that the backward would materialize in a non-fusible op."
)

ban_recompute_not_in_allowlist = Flag(
    True,
    doc="Only recompute allow-listed (cheap) ops; False switches to a block-list (sort, pool, ...).",
)

ban_recompute_reductions = Flag(
    True, doc="Ban recomputing reductions: their outputs are small but they are costly in fusions."
)

recompute_views = Flag(False, doc="Never save views: always recompute them (views are free).")

aggressive_recomputation = Flag(
    False,
    doc="Turn every ban_recompute_* heuristic off except ban_recompute_reductions (saves memory).",
)

min_cut_solver = Flag(
    "scipy",
    choices=("scipy", "networkx"),
    env="AOT_MIN_CUT_SOLVER",
    doc="Max-flow solver for the min-cut partitioner ('networkx' is the reference).",
)

# ---- activation memory budget --------------------------------------------------------------------

activation_memory_budget = Flag(
    1.0,
    type=float,
    range=(0.0, 1.0),
    doc="Fraction of the default policy's activation memory to keep: 0 = full recompute, 1 = default.",
)

activation_memory_budget_runtime_estimator = Flag(
    "flops",
    choices=("flops", "profile", "testing"),
    doc="Op runtime estimate for the budget: FLOP count, benchmarking, or 1 per op ('testing').",
)

activation_memory_budget_solver = Flag(
    "dp",
    choices=("dp", "greedy", "ilp", "ilp_graph", "dp_graph"),
    doc="0-1 knapsack solver for the budget: dp, greedy, ilp (scipy), ilp_graph, dp_graph.",
)

visualize_memory_budget_pareto = Flag(
    False,
    env="PARTITIONER_MEMORY_BUDGET_PARETO",
    compile_ignored="debug",
    doc="Draw runtime vs. activation memory for budgets 0..1 (step 0.5) as a PNG.",
)

# ---- fake tensors and effects ---------------------------------------------------------------------

fake_tensor_allow_unsafe_data_ptr_access = Flag(
    True, doc="Allow FakeTensor.data_ptr() instead of erroring (torch.compile turns this off)."
)

unlift_effect_tokens = Flag(
    False,
    doc="Insert make_token/sink_token calls in the graph instead of threading effect tokens.",
)

fake_tensor_propagate_real_tensors = Flag(
    False,
    doc="Also run real tensors alongside fake ones (resolves item() and checks fake vs. real).",
)

# ---- output and caching -----------------------------------------------------------------------------

torch_compile_graph_format = Flag(
    "svg",
    env="TORCH_COMPILE_GRAPH_FORMAT",
    compile_ignored="debug",
    doc="Default Graphviz output format for draw_graph (see graphviz.org/docs/outputs).",
)

enable_autograd_cache = Flag(
    False,
    env="ENABLE_AOT_AUTOGRAD_CACHE",
    doc="Cache AOTAutograd results across compilations.",
)

strict_autograd_cache = Flag(
    False, doc="Raise instead of warning when the AOTAutograd cache is bypassed (for tests)."
)

install_config_module(sys.modules[__name__])
