"""TorchDynamo flags: what torch/_dynamo/config.py (the seed) declares, without importing torch.

Flags the seed marks ``[@compile_ignored: ...]`` are compile-ignored here (``get_hash`` skips
them). The seed's "legacy, does nothing" flags are still accepted but warn when set.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aot_config.config_module import flag, install_config_module

if TYPE_CHECKING:
    # ConfigModule's methods (patch, get_hash, ...) as this module's functions, for checkers.
    from aot_config._config_typing import *  # noqa: F403

# ---- logging and debugging -----------------------------------------------------------------------

log_file_name: str | None = flag(
    None,
    type=str | None,
    compile_ignored="debug",
    doc="File to write dynamo logs to (TORCH_LOGS / torch._logging.set_logs pick the levels).",
)

verbose: bool = flag(
    False,
    env="TORCHDYNAMO_VERBOSE",
    compile_ignored="debug",
    doc="Print full stack traces on warnings and errors.",
)

verify_correctness: bool = flag(
    False,
    compile_ignored="runtime_behaviour",
    doc="Check the optimized backend's outputs against eager.",
)

# ---- graph capture ---------------------------------------------------------------------------------

minimum_call_count: int = flag(1, range=(1, None), doc="Ops needed before an FX graph is created.")

dead_code_elimination: bool = flag(True, doc="Run dead-code elimination on captured graphs.")

cache_size_limit: int = flag(
    8,
    range=(0, None),
    compile_ignored="runtime_behaviour",
    doc="Max cache entries per ID_MATCH'd object (or per code object without such guards).",
)

accumulated_cache_size_limit: int = flag(
    256,
    range=(0, None),
    compile_ignored="runtime_behaviour",
    doc="Max cache entries per code object overall: a safeguard against endless recompiles.",
)

specialize_int: bool = flag(
    False, doc="Specialize on int inputs under dynamic shapes (mostly for export: False)."
)

specialize_float: bool = flag(
    True, doc="Specialize on float inputs instead of promoting them to tensors."
)

dynamic_shapes: bool = flag(
    True,
    inert="legacy config; dynamic shapes are controlled by automatic_dynamic_shapes",
    doc="Legacy, does nothing.",
)

use_lazy_graph_module: bool = flag(
    True,
    env="TORCH_COMPILE_USE_LAZY_GRAPH_MODULE",
    doc="Compile GraphModule code lazily, on first call.",
)

assume_static_by_default: bool = flag(
    True,
    doc="Under dynamic shapes, only dims marked with mark_dynamic get symbols at first.",
)

# The seed's text is cut off after the comment describing this flag; torch declares it here.
automatic_dynamic_shapes: bool = flag(
    True,
    doc="Recompile a frame with dynamic shapes for dims that changed since the first compile.",
)

traceable_tensor_subclasses: set[type] = flag(
    set(),
    type=set[type],
    doc="Tensor subclasses dynamo may trace into.",
)

suppress_errors: bool = flag(
    False,
    env="TORCHDYNAMO_SUPPRESS_ERRORS",
    doc="Fall back to eager when torch._dynamo.optimize fails instead of raising.",
)

replay_record_enabled: bool = flag(
    False,
    env="TORCH_COMPILE_REPLAY_RECORD",
    doc="Record the failing frame's execution to a file when an exception occurs.",
)

rewrite_assert_with_torch_assert: bool = flag(
    True, doc="Rewrite Python assert statements to torch._assert."
)

disable: bool = flag(False, env="TORCH_COMPILE_DISABLE", doc="Disable dynamo entirely.")

cprofile: bool = flag(
    False, env="TORCH_COMPILE_CPROFILE", doc="Collect a cProfile trace of dynamo."
)

skipfiles_inline_module_allowlist: dict[Any, Any] = flag(
    {},
    type=dict[Any, Any],
    inert="legacy config; skipfiles no longer reads it",
    doc="Legacy, does nothing.",
)

allowed_functions_module_string_ignorelist: set[str] = flag(
    {"torch.distributions", "torch.testing", "torch._refs", "torch._prims", "torch._decomp"},
    type=set[str],
    doc="torch modules whose functions are never treated as allowed in FX graphs.",
)

# ---- minifier / repro --------------------------------------------------------------------------------

repro_after: str | None = flag(
    None,
    type=str | None,
    choices=(None, "aot", "dynamo"),
    env="TORCHDYNAMO_REPRO_AFTER",
    doc="Run the minifier on failure: None (off), 'dynamo' graphs or 'aot' graphs.",
)

repro_level: int = flag(
    2,
    range=(1, 4),
    env="TORCHDYNAMO_REPRO_LEVEL",
    doc="1: dump repro.py on failure; 2: minifier launcher on failure; 3: always; 4: on accuracy failure.",
)

repro_forward_only: bool = flag(
    False,
    env="TORCHDYNAMO_REPRO_FORWARD_ONLY",
    doc="Minify using the forward pass only.",
)

repro_tolerance: float = flag(
    1e-3,
    range=(0.0, None),
    compile_ignored="debug",
    doc="Divergence above which the minifier reports an accuracy failure.",
)

repro_ignore_non_fp: bool = flag(
    False,
    env="TORCHDYNAMO_REPRO_IGNORE_NON_FP",
    compile_ignored="debug",
    doc="Ignore non-floating-point values (e.g. bool tensors) when checking accuracy.",
)

same_two_models_use_fp64: bool = flag(
    True,
    compile_ignored="runtime_behaviour",
    doc="Compare models against an fp64 reference (uses more memory).",
)

# ---- what gets captured ------------------------------------------------------------------------------

capture_scalar_outputs: bool = flag(
    False,
    env="TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS",
    doc="Capture .item() and other scalar outputs instead of breaking the graph.",
)

capture_dynamic_output_shape_ops: bool = flag(
    False,
    env="TORCHDYNAMO_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS",
    doc="Capture ops with data-dependent output shapes instead of breaking the graph.",
)

prefer_deferred_runtime_asserts_over_guards: bool = flag(
    False, doc="Prefer deferred runtime asserts over guards."
)

_allow_complex_guards_as_runtime_asserts: bool = flag(
    False, doc="Turn complex guards into runtime asserts instead of erroring or specializing."
)

force_unspec_int_unbacked_size_like_on_torchrec_kjt: bool = flag(
    False, doc="Treat torchrec KJT _length_per_key/_offset_per_key ints as unbacked size-like."
)

enforce_cond_guards_match: bool = flag(
    True, doc="Require cond's true_fn and false_fn to produce the same guards."
)

# ---- DDP --------------------------------------------------------------------------------------------

_ddp_optimization_mode = (
    "ddp_optimizer",
    "python_reducer",  # experimental
    "python_reducer_without_compiled_forward",  # experimental
    "no_optimization",
)


def _check_optimize_ddp(value: bool | str) -> str | None:
    if isinstance(value, bool) or value in _ddp_optimization_mode:
        return None
    return f"expected True, False or one of {', '.join(map(repr, _ddp_optimization_mode))}"


optimize_ddp: bool | str = flag(
    True,
    type=bool | str,
    validator=_check_optimize_ddp,
    doc="DDP mode: ddp_optimizer (True), python_reducer, python_reducer_without_compiled_forward, "
    "no_optimization (False).",
)

do_not_emit_runtime_asserts: bool = flag(
    False,
    env="TORCH_DYNAMO_DO_NOT_EMIT_RUNTIME_ASSERTS",
    doc="Keep runtime asserts as shape hints but do not emit them in the graph.",
)

optimize_ddp_lazy_compile: bool = flag(False, inert="no longer used", doc="Legacy, does nothing.")

skip_fsdp_guards: bool = flag(True, doc="Skip guards on FSDP-managed modules.")

skip_fsdp_hooks: bool = flag(
    False, doc="Apply torch._dynamo.disable() to per-parameter FSDP hooks."
)

skip_nnmodule_hook_guards: bool = flag(
    True, doc="Do not guard on nn.Module hooks (unsafe if hooks change after compiling)."
)

# ---- errors ---------------------------------------------------------------------------------------------

raise_on_ctx_manager_usage: bool = flag(True, doc="Raise when dynamo is used as a context manager.")

raise_on_unsafe_aot_autograd: bool = flag(False, doc="Raise when AOT autograd is unsafe to use.")

error_on_nested_jit_trace: bool = flag(
    True, doc="Raise when torch.jit.trace is applied to a dynamo-optimized function."
)

error_on_nested_fx_trace: bool = flag(
    True, doc="Raise a clear error when symbolic tracing a dynamo-optimized function."
)

allow_rnn: bool = flag(False, doc="Trace RNNs instead of breaking the graph on them.")

error_on_recompile: bool = flag(False, doc="Raise when a seen function would be recompiled.")

report_guard_failures: bool = flag(
    True, inert="deprecated, no longer used", doc="Legacy, does nothing."
)


def _default_base_dir() -> str:
    # The seed points at the directory holding the torch package; find it without importing torch.
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


base_dir: str = flag(
    _default_base_dir(),
    doc="Directory that holds the torch package (the project root for skip rules).",
)

# ---- NumPy -------------------------------------------------------------------------------------------------

trace_numpy: bool = flag(True, doc="Trace NumPy code instead of breaking the graph.")

numpy_default_float: str = flag("float64", doc="Default NumPy float dtype when tracing NumPy.")

numpy_default_complex: str = flag(
    "complex128", doc="Default NumPy complex dtype when tracing NumPy."
)

numpy_default_int: str = flag("int64", doc="Default NumPy int dtype when tracing NumPy.")

use_numpy_random_stream: bool = flag(False, doc="Use NumPy's RNG stream instead of torch's.")

# ---- guards and modules --------------------------------------------------------------------------------------

enable_cpp_guard_manager: bool = flag(
    True, env="TORCHDYNAMO_CPP_GUARD_MANAGER", doc="Use the C++ guard manager."
)

inline_inbuilt_nn_modules: bool = flag(
    False,
    env="TORCHDYNAMO_INLINE_INBUILT_NN_MODULES",
    doc="Inline built-in nn.Modules instead of treating them as graph leaves.",
)

# ---- debug directory -------------------------------------------------------------------------------------------

DEBUG_DIR_VAR_NAME = "TORCH_COMPILE_DEBUG_DIR"


def default_debug_dir_root(environ: Mapping[str, str] | None = None) -> str:
    """``$TORCH_COMPILE_DEBUG_DIR/torch_compile_debug`` if set, else ``./torch_compile_debug``.

    The seed's internal-build branch (a per-user temp dir) is dropped: we are never that build.
    """
    variables = os.environ if environ is None else environ
    if DEBUG_DIR_VAR_NAME in variables:
        return os.path.join(variables[DEBUG_DIR_VAR_NAME], "torch_compile_debug")
    return os.path.join(os.getcwd(), "torch_compile_debug")


debug_dir_root: str = flag(
    os.path.join(os.getcwd(), "torch_compile_debug"),
    env=DEBUG_DIR_VAR_NAME,
    env_parse=lambda raw: os.path.join(raw, "torch_compile_debug"),
    # Where debug output goes never changes compiled code; ignoring it keeps the hash cwd-free.
    compile_ignored="debug",
    doc="Root for debug output: $TORCH_COMPILE_DEBUG_DIR/torch_compile_debug or ./torch_compile_debug.",
)

_save_config_ignore = {
    "repro_after",
    "repro_level",
    # "cannot pickle PyCapsule" in torch
    "constant_functions",
    # "cannot pickle module" in torch
    "skipfiles_inline_module_allowlist",
}

# ---- cudagraphs and ops ------------------------------------------------------------------------------------------

cudagraph_backend_keep_input_mutation: bool = flag(
    False, doc="backend='cudagraphs': send input mutations to cudagraphs instead of replaying them."
)

cudagraph_backend_support_input_mutation: bool = flag(
    False, doc="Support mutated inputs coming from a previous cudagraph pool."
)

only_allow_pt2_compliant_ops: bool = flag(
    False, doc="Only ops tagged torch.Tag.pt2_compliant enter the graph; others fall back to eager."
)

capture_autograd_function: bool = flag(True, doc="Capture autograd.Function subclasses.")

capture_func_transforms: bool = flag(True, doc="Trace torch.func transforms.")

log_compilation_metrics: bool = flag(True, doc="Log compilation metrics to the log file.")

reorderable_logging_functions: set[Callable[..., Any]] = flag(
    set(),
    type=set[Callable],
    doc="Logging functions moved to the end of a graph break so dynamo builds larger graphs.",
)

inject_BUILD_SET_unimplemented_TESTING_ONLY: bool = flag(
    False, doc="Pretend BUILD_SET is unsupported (testing only)."
)

_autograd_backward_strict_mode_banned_ops: list[str] = flag(
    ["stride", "requires_grad", "storage_offset", "layout", "data"],
    type=list[str],
    doc="Tensor attributes banned in backward strict mode (plus is_* methods, see "
    "autograd_backward_strict_mode_banned_ops).",
)

fake_tensor_cache_enabled: bool = flag(
    True, env="TORCH_FAKE_TENSOR_DISPATCH_CACHE", doc="Cache fake tensor dispatch results."
)

fake_tensor_cache_crosscheck_enabled: bool = flag(
    False,
    env="TORCH_FAKE_TENSOR_DISPATCH_CACHE_CROSSCHECK",
    doc="Cross-check cached fake tensor dispatch results against fresh dispatch.",
)

compiled_autograd: bool = flag(
    False,
    doc="Trace .backward() calls under torch.compile with compiled autograd.",
)


def autograd_backward_strict_mode_banned_ops(tensor_type: type) -> list[str]:
    """The seed's banned list: the flag's names plus every ``is_*`` member of ``tensor_type``.

    Pass ``torch.Tensor``; the seed computed this at import, which would import torch here.
    """
    module = sys.modules[__name__]
    names = list(module._autograd_backward_strict_mode_banned_ops)
    names.extend(name for name in dir(tensor_type) if name.startswith("is_"))
    return names


def get_optimize_ddp_mode() -> str:
    """``optimize_ddp`` as one of the four mode names (True/False map to their modes)."""
    value = sys.modules[__name__].optimize_ddp
    if isinstance(value, bool):
        return "ddp_optimizer" if value else "no_optimization"
    if value not in _ddp_optimization_mode:
        # Unreachable through attribute writes (validated); guards direct _overrides edits.
        raise ValueError(
            f"optimize_ddp = {value!r} is not a mode: expected one of {_ddp_optimization_mode}"
        )
    return value


# The seed's private name for the helper.
_get_optimize_ddp_mode = get_optimize_ddp_mode

install_config_module(sys.modules[__name__])
