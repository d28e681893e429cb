"""The ``aot_pipeline`` torch.compile back end.

Dynamo's graph goes through AOTAutograd (``aot_module_simplified``) with aot_partition's
min-cut partitioner under our flags (``aot_config.functorch``), then forward and backward are
compiled by Inductor or by one of aot_compilers' compilers.

With Inductor, ``compile_fx`` runs AOTAutograd itself (so its decompositions, joint-graph passes
and output-stride handling stay as in ``backend="inductor"``); we hand it our partitioner through
``torch._inductor.config.custom_partitioner_fn``, which replaces Inductor's own min-cut
partitioner. With the other compilers we call AOTAutograd directly with ``partition_fn``.

``AotPipelinePartitioner`` is a module-level class that pickles to our cache key (sources,
budget, solver, partitioner flags), so Inductor's FX graph cache and AOTAutograd's cache work
across processes and miss when any of those change. ``mode`` and Inductor ``options`` become
the same ``compile_fx`` config patches ``backend="inductor"`` uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import torch.fx as fx
from aot_partition.errors import FlagConflictError

from . import _compat, step_cap, torch_chunkers, transformers_logging
from .gc_deferral import full_collections_deferred
from .options import (
    BUDGET_OPTIONS,
    PipelineOptionError,
    PipelineOptions,
    check_budget_given_once,
    inductor_pairs,
    split_options,
)
from .recording import PartitionRecorder
from .splitting import with_token_split

if typing.TYPE_CHECKING:
    from aot_partition import PartitionConfig

log = logging.getLogger(__name__)

CompiledGraph = Callable[..., Any]
PartitionFn = Callable[..., tuple[fx.GraphModule, fx.GraphModule]]


def default_options() -> PipelineOptions:
    """Options from the flags: ``activation_memory_budget`` and ``..._solver`` as the
    partitioner reads them (ours, or torch's ``torch._functorch.config`` flag of the same name
    when only that one is set; both set to different values raise
    ``aot_partition.FlagConflictError``: see aot_partition.flags), and our byte cap."""
    from aot_config import functorch as functorch_flags
    from aot_partition import PartitionConfig

    config = PartitionConfig.from_flags()
    return PipelineOptions(
        split=functorch_flags.activation_token_split,
        memory_budget=float(config.memory_budget),
        solver=str(config.budget_solver),
        memory_budget_bytes=config.memory_budget_bytes,
        memory_budget_best_effort=bool(config.best_effort),
        memory_peak_bytes=config.peak_bytes,
        memory_peak_fraction=config.peak_fraction,
    )


# Our options that set a partitioner flag (aot_config.functorch's, or torch's of the same name).
FLAG_OF_OPTION = {
    "memory_budget": "activation_memory_budget",
    "memory_budget_bytes": "activation_memory_budget_bytes",
    "memory_peak_bytes": "activation_memory_peak_bytes",
    "memory_peak_fraction": "activation_memory_peak_fraction",
    "memory_budget_best_effort": "activation_memory_budget_best_effort",
    "solver": "activation_memory_budget_solver",
    "split": "activation_token_split",
}


class OptionFlagConflictError(PipelineOptionError, FlagConflictError):
    """An option given to aot_pipeline and a partitioner flag someone set disagree: the
    partitioner would follow only one of them, so neither is chosen silently.

    A ``FlagConflictError`` too (the documented error for flags that disagree), so code that
    catches that one catches this. As such, ``name`` is the flag's name
    (``activation_memory_budget``), ``torch_value`` the flag's value (torch's flag or ours:
    ``flag`` says which) and ``our_value`` the option's."""

    def __init__(self, option: str, value: Any, flag: str, flag_value: Any) -> None:
        self.option, self.value, self.flag, self.flag_value = option, value, flag, flag_value
        self.name, self.torch_value, self.our_value = flag.rpartition(".")[2], flag_value, value
        self.problem = "an aot_pipeline option and a set flag disagree"
        # Not FlagConflictError.__init__: its message speaks of two flags.
        ValueError.__init__(
            self, f"aot_pipeline option {option}={value!r} and the flag {flag} = "
                  f"{flag_value!r} disagree; drop the option or unset the flag (or give both "
                  "the same value)")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (a worker process's error)
        return (type(self), (self.option, self.value, self.flag, self.flag_value))


def _flag_source(flag: str) -> str:
    """Where a set partitioner flag was set: ours, else torch's."""
    from aot_config import functorch as functorch_flags

    config = "aot_config.functorch" if not functorch_flags.is_default(flag) \
        else "torch._functorch.config"
    return f"{config}.{flag}"


def with_explicit_options(explicit: Mapping[str, Any],
                          base: PipelineOptions | None = None) -> PipelineOptions:
    """``base`` (default: the flags, ``default_options``) with the options a caller gave
    explicitly. A given option that a set flag contradicts raises OptionFlagConflictError:
    an argument never silently overrides a flag a user or their framework set, nor the
    reverse. A budget given in one form (a fraction, bytes, a peak) replaces the flags' budget
    in every form, so ``"300MiB"`` against a set fraction flag is a conflict too."""
    check_budget_given_once(explicit)  # one options dict naming a budget twice
    flags = default_options() if base is None else base
    given = dict(explicit)
    if given.keys() & set(BUDGET_OPTIONS):
        given = {**dict.fromkeys(BUDGET_OPTIONS[1:]), **given}
    resolved = replace(flags, **given)
    unset = PipelineOptions()
    for option in sorted(given.keys() & FLAG_OF_OPTION.keys()):
        flag_value, value = getattr(flags, option), getattr(resolved, option)
        if flag_value != getattr(unset, option) and flag_value != value:
            shown = explicit.get("memory_budget", value) if option in BUDGET_OPTIONS else value
            shown_option = "memory_budget" if option in BUDGET_OPTIONS else option
            raise OptionFlagConflictError(shown_option, shown, _flag_source(FLAG_OF_OPTION[option]),
                                          flag_value)
    return resolved


def make_partition_fn(options: PipelineOptions,
                      recorder: PartitionRecorder | None = None) -> PartitionFn:
    """aot_partition's min-cut partitioner run under ``options``' budget and solver."""

    def partition(joint_module: fx.GraphModule, joint_inputs: Sequence[Any],
                  **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        from aot_partition import min_cut_rematerialization_partition

        if recorder is not None:
            recorder.record_joint(joint_module, joint_inputs, kwargs)
        chunkers = torch_chunkers.describe(joint_module.graph)
        if chunkers is not None:
            log.info("%s", chunkers)
        peak_bytes, peak_fraction = _step_share(options, joint_module, joint_inputs, kwargs)
        with _flags_of(options.memory_budget, options.solver, options.memory_budget_bytes,
                       options.memory_budget_best_effort, peak_bytes, peak_fraction):
            forward, backward = min_cut_rematerialization_partition(
                joint_module, joint_inputs, **kwargs)
        if recorder is not None:
            recorder.record_forward(forward, backward, kwargs.get("num_fwd_outputs"),
                                    kwargs.get("static_lifetime_input_indices"))
            recorder.compiles_on()  # a plan only compared stops here (splitting.py)
        log.debug("partitioned a joint graph (budget %s, %s bytes, solver %s)",
                  options.memory_budget, options.memory_budget_bytes, options.solver)
        return forward, backward

    return partition


def step_context() -> step_cap.StepContext | None:
    current = step_cap.current()
    return None if current is None else current[0]


def _step_share(options: PipelineOptions, joint: fx.GraphModule, inputs: Sequence[Any],
                kwargs: dict[str, Any]) -> tuple[int | None, float | None]:
    """The peak cap this joint is partitioned under: ``options``' own, or, under a step's
    fraction cap (step_cap.py), this graph's share of it in bytes, from the joint's uncapped
    cut priced once per graph (the first joint the graph's compile partitions: the whole
    graph). The first graph of a step keeps the partitioner's fraction; its joint is kept,
    to price it only if a later graph needs the step's uncapped reference."""
    current = step_cap.current()
    if current is None or current[0].step_fraction is None:
        return options.memory_peak_bytes, options.memory_peak_fraction
    context, sink = current
    if sink.top is None and sink.joint is None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # a joint may hold real tensor constants
            kept = (_compat.deepcopy_graph(joint), list(inputs), dict(kwargs))
        if context.partitioner_fraction:
            sink.joint = kept
        else:
            model = "inductor" if options.compiler == "inductor" else "eager"
            sink.top, sink.uncapped_saved = step_cap.uncapped_price(*kept, model)
    if context.partitioner_fraction:
        return options.memory_peak_bytes, options.memory_peak_fraction
    assert sink.top is not None
    sink.limit = max(0, context.graph_limit(sink.top))
    log.info("step peak cap %g, graph %d: capped at %d bytes of its own (the uncapped step "
             "so far peaks at %d bytes; %d bytes held beside this graph)",
             context.step_fraction, context.graph, sink.limit,
             max(context.reference_bytes, sink.top + context.offset_uncapped_bytes),
             context.offset_bytes)
    return sink.limit, None


@cache
def _sources_digest() -> str:
    """A digest of the partitioner's, our flags' and this package's sources (cache keys)."""
    import aot_config
    import aot_partition

    digest = hashlib.sha256()
    for package in (aot_partition, aot_config, sys.modules[__package__]):
        if package.__file__ is None:  # a namespace package: never one of these three
            raise RuntimeError(f"{package.__name__} has no __file__ to find its sources by")
        package_dir = Path(package.__file__).parent
        for path in sorted(package_dir.rglob("*.py")):
            digest.update(path.relative_to(package_dir).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _flags_of(memory_budget: float | str, solver: str, memory_budget_bytes: int | None = None,
              best_effort: bool = False, peak_bytes: int | None = None,
              peak_fraction: float | None = None) -> Any:
    """The partitioner flags patched with a back end's budget and solver (a context manager)."""
    from aot_config import functorch as functorch_flags

    return functorch_flags.patch(activation_memory_budget=memory_budget,
                                 activation_memory_budget_bytes=memory_budget_bytes,
                                 activation_memory_budget_best_effort=best_effort,
                                 activation_memory_peak_bytes=peak_bytes,
                                 activation_memory_peak_fraction=peak_fraction,
                                 activation_memory_budget_solver=solver)


def _autograd_cache_off_on_many_ranks(config: PartitionConfig) -> Any:
    """AOTAutograd's cache off for one compile when partitioning will run collectives on many
    ranks (aot_partition.costs.spmd.partitioning_runs_collectives): a rank whose cache hits
    skips partitioning and would leave the others waiting in its collectives (a hang, or a
    collective mismatched with the next one). Every rank decides the same from the same
    flags (``config``: what the partitioner will read). Inductor's FX graph cache stays on: it
    runs after partitioning."""
    from aot_partition.costs.spmd import partitioning_runs_collectives

    if not partitioning_runs_collectives(config):
        return contextlib.nullcontext()
    log.info("AOTAutograd's cache is off for this graph: partitioning runs collectives on "
             "every rank ('profile' times agreed or the saved-set check), and a cache hit on "
             "some ranks only would leave the others waiting in them")
    from torch._functorch import config as torch_functorch_config

    return torch_functorch_config.patch(enable_autograd_cache=False,
                                        enable_remote_autograd_cache=False)


def _partition_settings(memory_budget: float, solver: str, memory_budget_bytes: int | None,
                        best_effort: bool, peak_bytes: int | None = None,
                        peak_fraction: float | None = None) -> tuple[str, PartitionConfig]:
    """The hash of the ``aot_config.functorch`` flags and the ``PartitionConfig`` the
    partitioner will read from them (torch's flags of the same names included:
    aot_partition.flags), with a back end's budget and solver patched in."""
    from aot_config import functorch as functorch_flags
    from aot_partition import PartitionConfig

    with _flags_of(memory_budget, solver, memory_budget_bytes, best_effort, peak_bytes,
                   peak_fraction):
        return functorch_flags.get_hash().hex(), PartitionConfig.from_flags()


def _cache_key(memory_budget: float, solver: str, memory_budget_bytes: int | None,
               best_effort: bool, flags_hash: str, config: PartitionConfig) -> tuple[str, ...]:
    return ("aot_pipeline", _sources_digest(), repr(float(memory_budget)), solver,
            repr(memory_budget_bytes), repr(best_effort), flags_hash, repr(config))


def partitioner_cache_key(memory_budget: float, solver: str,
                          memory_budget_bytes: int | None = None,
                          best_effort: bool = False, peak_bytes: int | None = None,
                          peak_fraction: float | None = None) -> tuple[str, ...]:
    """What decides how our partitioner splits a joint graph, for Inductor's and AOTAutograd's
    cache keys: our sources, the budget and solver, and the hash of every compile-relevant
    ``aot_config.functorch`` flag as the partitioner will see them (budget and solver patched
    in, so a flag overridden by the options does not split the cache)."""
    settings = _partition_settings(memory_budget, solver, memory_budget_bytes, best_effort,
                                   peak_bytes, peak_fraction)
    return _cache_key(memory_budget, solver, memory_budget_bytes, best_effort, *settings)


def _restore_partitioner(memory_budget: float, solver: str, key_when_pickled: object,
                         memory_budget_bytes: int | None = None,
                         best_effort: bool = False, peak_bytes: int | None = None,
                         peak_fraction: float | None = None,
                         step: step_cap.StepContext | None = None) -> AotPipelinePartitioner:
    # The key rides in the pickle only so that a cache hashing the pickled config covers it;
    # a restored partitioner computes its own from the flags of the process it lands in.
    del key_when_pickled
    return AotPipelinePartitioner(memory_budget, solver, memory_budget_bytes=memory_budget_bytes,
                                  best_effort=best_effort, peak_bytes=peak_bytes,
                                  peak_fraction=peak_fraction, step=step)


class AotPipelinePartitioner(_compat.custom_partitioner_base()):  # type: ignore[misc]
    """Inductor's ``custom_partitioner_fn``: our partitioner in place of Inductor's min-cut.

    Inductor pickles its config into the FX graph cache key (and AOTAutograd's), this object
    included, and adds ``uuid()``: both stand for our sources, the budget, the solver and the
    partitioner flags (``partitioner_cache_key``), so a change to any of them is a cache miss.
    The ``recorder`` is not pickled (it collects graphs in this process only). ``step``: the
    share of a step's peak cap this graph gets (step_cap.py), in the key too: under a step's
    fraction cap the partition depends on the graphs before it.
    """

    def __init__(self, memory_budget: float, solver: str,
                 recorder: PartitionRecorder | None = None, *,
                 memory_budget_bytes: int | None = None, best_effort: bool = False,
                 peak_bytes: int | None = None, peak_fraction: float | None = None,
                 step: step_cap.StepContext | None = None) -> None:
        self.memory_budget = memory_budget
        self.step = step
        self.memory_budget_bytes = memory_budget_bytes
        self.best_effort = best_effort
        self.peak_bytes = peak_bytes
        self.peak_fraction = peak_fraction
        self.solver = solver
        self.recorder = recorder
        # The settings it will partition with, read once: for its cache key and the back end.
        flags_hash, self.config = _partition_settings(memory_budget, solver, memory_budget_bytes,
                                                      best_effort, peak_bytes, peak_fraction)
        self._key = _cache_key(memory_budget, solver, memory_budget_bytes, best_effort,
                               flags_hash, self.config)
        if step is not None:
            self._key += (repr(step),)
        self._partition = make_partition_fn(
            PipelineOptions(memory_budget=memory_budget, solver=solver,
                            memory_budget_bytes=memory_budget_bytes,
                            memory_budget_best_effort=best_effort, memory_peak_bytes=peak_bytes,
                            memory_peak_fraction=peak_fraction), recorder)

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object],
                 **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        return self._partition(gm, joint_inputs, **kwargs)

    def uuid(self) -> tuple[str, ...]:
        return self._key

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_partitioner, (self.memory_budget, self.solver, self._key,
                                       self.memory_budget_bytes, self.best_effort,
                                       self.peak_bytes, self.peak_fraction, self.step))

    def __repr__(self) -> str:
        nbytes = (f", memory_budget_bytes={self.memory_budget_bytes}"
                  if self.memory_budget_bytes is not None else "")
        nbytes += f", peak_bytes={self.peak_bytes}" if self.peak_bytes is not None else ""
        nbytes += (f", peak_fraction={self.peak_fraction}"
                   if self.peak_fraction is not None else "")
        nbytes += ", best_effort=True" if self.best_effort else ""
        return (f"AotPipelinePartitioner(memory_budget={self.memory_budget}{nbytes}, "
                f"solver={self.solver!r})")


def inductor_config_patches(options: PipelineOptions) -> dict[str, Any]:
    """The Inductor config ``options.mode`` and ``options.inductor_options`` stand for.

    ``mode`` goes through ``torch._inductor.list_mode_options`` as for ``backend="inductor"``
    (``"default"`` is no change), then the Inductor options on top, checked like
    ``torch.compile`` checks them (known name, value of the declared type).
    """
    patches: dict[str, Any] = {}
    if options.mode not in (None, "default"):
        try:
            patches.update(_compat.inductor_mode_options(options.mode))
        except RuntimeError:
            raise PipelineOptionError(
                f"unknown mode {options.mode!r}; choose one of "
                f"{', '.join(_compat.inductor_mode_options())}"
            ) from None
    if options.inductor_options:
        known = _compat.inductor_config_keys()
        ours, inductor = split_options(options.inductor_config, known)
        if ours:
            raise PipelineOptionError(
                f"{', '.join(sorted(ours))} are aot_pipeline options, not Inductor's; pass them "
                "as such (aot_pipeline.compile keyword arguments)"
            )
        for name, value in inductor.items():
            if name in _OWN_INDUCTOR_KEYS:
                raise PipelineOptionError(
                    f"Inductor option {name!r} is set by aot_pipeline (our partitioner)"
                )
            declared = _compat.inductor_config_type(name)
            if typing.get_origin(declared) is None and isinstance(declared, type) \
                    and not isinstance(value, declared):
                raise PipelineOptionError(
                    f"Inductor option {name!r} must be of type {declared.__name__}, got "
                    f"{value!r} ({type(value).__name__})"
                )
        patches.update(inductor)
    return patches


# Inductor config we set ourselves.
_OWN_INDUCTOR_KEYS = frozenset({"custom_partitioner_fn"})
# Whether any of our back ends has compiled with CUDA graphs in this process.
_used_cudagraphs = False


def _reset() -> None:
    """``torch._dynamo.reset()`` hook: drop CUDA graph trees as ``backend="inductor"`` does."""
    from torch._inductor import config

    if _used_cudagraphs or config.triton.cudagraphs:
        _compat.reset_cudagraph_trees()


def _inductor_backend(options: PipelineOptions, recorder: PartitionRecorder | None,
                      region: dict[str, str]) -> Callable[..., CompiledGraph]:
    patches = inductor_config_patches(options)
    # Imported now: when make_backend() or aot_pipeline.compile() is called (before tracing, as
    # torch.compile(backend="inductor") does), or at the first graph of
    # torch.compile(backend="aot_pipeline").
    _compat.compile_fx()

    def compile_with_inductor(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        global _used_cudagraphs

        # A new one per graph: its cache key reads the flags as they are now.
        partitioner = AotPipelinePartitioner(
            float(options.memory_budget), options.solver, recorder,
            memory_budget_bytes=options.memory_budget_bytes,
            best_effort=options.memory_budget_best_effort,
            peak_bytes=options.memory_peak_bytes, peak_fraction=options.memory_peak_fraction,
            step=step_context())
        config_patches = {**patches, "custom_partitioner_fn": partitioner}
        if recorder is not None and recorder.bypass_caches:
            # A cache hit (AOTAutograd's or Inductor's) skips partitioning and the recorder
            # would see nothing; with the FX graph cache off both are bypassed. Kernels stay
            # cached.
            config_patches["fx_graph_cache"] = False
        if config_patches.get("triton.cudagraphs"):
            _used_cudagraphs = True
        with full_collections_deferred(options.defer_full_gc), \
                _autograd_cache_off_on_many_ranks(partitioner.config):
            return _compat.compile_fx()(gm, example_inputs, inner_compile=inner_compile,
                                        config_patches=config_patches, **region)

    def inner_compile(*args: Any, **kwargs: Any) -> Any:
        # Also the backward's compile, which AOTAutograd runs at the first backward, after
        # compile_with_inductor has returned.
        with full_collections_deferred(options.defer_full_gc):
            return _compat.compile_fx_inner()(*args, **kwargs)

    return compile_with_inductor


def _graph_compiler(name: str) -> Callable[..., Any]:
    import aot_compilers

    try:
        return getattr(aot_compilers, name)
    except AttributeError:
        raise ValueError(
            f"compiler {name!r} is not available from aot_compilers (installed version lacks it)"
        ) from None


def resolve_options(options: PipelineOptions | Mapping[str, Any] | None = None,
                    mode: str | None = None) -> PipelineOptions:
    """``options`` as ``PipelineOptions``: given as such, or a dict as ``torch.compile(...,
    options=...)`` hands it to ``backend="aot_pipeline"`` (unset values from the flags, read
    now; ``compiled_autograd`` refused: the backward runs outside the compiled graph).
    ``mode`` (torch.compile's), when given, replaces the options' mode."""
    if isinstance(options, PipelineOptions):
        resolved = options
    else:
        if isinstance(options, Mapping) and "compiled_autograd" in options:
            raise PipelineOptionError(
                "compiled_autograd cannot be set through torch.compile options (the backward "
                "runs outside the compiled graph); use "
                "aot_pipeline.compile(model, compiled_autograd=True)"
            )
        ours, inductor = split_options(options, _compat.inductor_config_keys())
        resolved = with_explicit_options(ours)
        if inductor:
            resolved = replace(resolved, inductor_options=inductor_pairs(
                {**resolved.inductor_config, **inductor}))
    return replace(resolved, mode=mode) if mode is not None else resolved


def _region(name: str | None) -> dict[str, str]:
    """``torch.compile``'s ``name`` as the ``compile_region_name`` torch's compilers take."""
    if name is None:
        return {}
    if not isinstance(name, str):
        raise PipelineOptionError(
            f"name must be a string naming the compiled region, got {name!r}")
    if not _compat.compile_region_names_supported():
        import torch

        raise PipelineOptionError(
            f"name={name!r} needs torch 2.13 or later (compiled region names); this is torch "
            f"{torch.__version__}")
    return {"compile_region_name": name}


def make_backend(options: PipelineOptions | Mapping[str, Any] | None = None,
                 recorder: PartitionRecorder | None = None, *,
                 mode: str | None = None, name: str | None = None,
                 model: Any = None) -> Callable[..., CompiledGraph]:
    """A torch.compile back end (``gm, example_inputs -> callable``) for ``options``.

    ``torch.compile(m, backend=make_backend(options, mode=mode))`` compiles as
    ``torch.compile(m, backend="aot_pipeline", options=options, mode=mode)`` does, but the
    options are checked here, and with Inductor its ``compile_fx`` is imported here, before
    Dynamo traces, as ``backend="inductor"`` does: the registered name learns its options only
    with the first graph and imports it inside Dynamo's compile, where CPython runs
    call-heavy Python slower (Dynamo's frame-evaluation hook is installed). The back end keeps
    its options in ``.options``. ``recorder`` collects each partitioned forward graph, to
    measure the bytes it saves. ``name`` is ``torch.compile``'s name of the compiled region
    (Inductor's profiler labels, AOTAutograd's records; torch 2.13 on). A peak cap bounds the
    whole step across the graphs this back end compiles (step_cap.py); ``model``, the
    ``nn.Module`` compiled, lets the first graphs reserve the later graphs' parameters.
    """
    options = resolve_options(options, mode)
    region = _region(name)
    # Before Dynamo traces (here for compile() and make_backend users; per graph for the name):
    # else GPT-2's loss_function graph-breaks between the LM head and its loss.
    transformers_logging.ignore_loss_warning_in_dynamo()
    # One back end compiles every graph of a step: a peak cap is the step's (step_cap.py).
    step = step_cap.StepCap(options.memory_peak_bytes, options.memory_peak_fraction, model,
                            "inductor" if options.compiler == "inductor" else "eager")
    if options.compiler == "inductor":
        backend = with_token_split(
            options, recorder, lambda opts, rec: _inductor_backend(opts, rec, region), step)
        backend.reset = _reset  # type: ignore[attr-defined]
    else:
        graph_compiler = _graph_compiler(options.compiler)

        def aot_backend(opts: PipelineOptions, rec: PartitionRecorder | None
                        ) -> Callable[..., CompiledGraph]:
            partition = make_partition_fn(opts, rec)

            def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
                # A fresh AOTAutograd back end per graph: it stores wrapped compilers on itself.
                with full_collections_deferred(opts.defer_full_gc):
                    return _compat.aot_autograd(
                        fw_compiler=graph_compiler, bw_compiler=graph_compiler,
                        partition_fn=partition, keep_inference_input_mutations=True, **region,
                    )(gm, example_inputs)

            return backend

        backend = with_token_split(options, recorder, aot_backend, step)

    backend.__name__ = f"aot_pipeline_{options.compiler}"
    backend.options = options  # type: ignore[attr-defined]
    return backend


def aot_pipeline_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                         options: dict[str, Any] | None = None, mode: str | None = None,
                         name: str | None = None) -> CompiledGraph:
    """``torch.compile(model, backend="aot_pipeline", mode=..., options={...}, name=...)``.

    ``options`` may set ``memory_budget``, ``solver`` and ``compiler`` (unset ones come from
    ``aot_config.functorch``: ``activation_memory_budget``, ``activation_memory_budget_solver``;
    compiler ``"inductor"``) and any ``torch._inductor.config`` setting; ``mode`` is applied
    to Inductor as ``backend="inductor"`` applies it; ``name`` (passed on by torch 2.15's
    ``torch.compile``) names the compiled region.
    """
    return make_backend(options, mode=mode, name=name)(gm, example_inputs)


aot_pipeline_backend.reset = _reset  # type: ignore[attr-defined]


class _LoadedAtLookup:
    """What Dynamo's registry holds for our name until ``torch.compile`` looks it up, as an
    entry point would be held: loading it imports Inductor's ``compile_fx``, at
    ``torch.compile(...)``, before Dynamo traces, as ``backend="inductor"`` does (imported
    inside Dynamo's compile instead, it ran under Dynamo's frame-evaluation hook and made a warm
    compile through the name 5-6% slower than Inductor's). Users of the name with
    ``compiler="nop"`` pay that import (about 0.6 s of CPU once per process) without needing
    it: ``make_backend(options)`` and ``aot_pipeline.compile()`` import it only for Inductor."""

    name = "aot_pipeline"

    def load(self) -> Callable[..., CompiledGraph]:
        _compat.compile_fx()
        transformers_logging.ignore_loss_warning_in_dynamo()  # at lookup: before any trace
        return aot_pipeline_backend


def _name_in_dynamo_registry() -> bool:
    """Name ``aot_pipeline`` in Dynamo's registry, loaded at lookup (``_LoadedAtLookup``);
    False when the name is known already.

    Without this, ``torch.compile(backend="aot_pipeline")`` finds us through our
    ``torch_dynamo_backends`` entry point, and torch's ``lookup_backend`` first imports every
    ``torch._dynamo.backends`` module and scans the installed entry points for any name not
    registered yet: 0.2 s of CPU per process, which ``backend="inductor"`` never pays. Once
    this module is imported the name resolves directly, to the same function.

    Not when the registry knows the name already: either the scan ran (then torch loads our
    entry point itself, ``registered.py``, which does the same) or a user's back end took it.
    """
    from torch._dynamo.backends import registry

    known = getattr(registry, "_BACKENDS", None)  # None: another torch layout, leave it be
    functions = getattr(registry, "_COMPILER_FNS", None)
    if known is None or functions is None or "aot_pipeline" in known \
            or "aot_pipeline" in functions:
        return False
    known["aot_pipeline"] = _LoadedAtLookup()
    return True


_name_in_dynamo_registry()
