"""The ``aot_pipeline`` torch.compile back end.

Dynamo's graph goes through AOTAutograd (``aot_module_simplified``) with aot_partition's
min-cut partitioner under our flags (``aot_config.functorch``), then forward and backward are
compiled by Inductor or by one of aot_compilers' compilers.

With Inductor, ``compile_fx`` runs AOTAutograd itself (so its decompositions, joint-graph passes
and output-stride handling stay as in ``backend="inductor"``); we hand it our partitioner through
``torch._inductor.config.custom_partitioner_fn``, which replaces Inductor's own min-cut
partitioner. With the other compilers we call AOTAutograd directly with ``partition_fn``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch.fx as fx

from . import _compat
from .options import PipelineOptionError, PipelineOptions
from .recording import PartitionRecorder

log = logging.getLogger(__name__)

CompiledGraph = Callable[..., Any]
PartitionFn = Callable[..., tuple[fx.GraphModule, fx.GraphModule]]


def default_options() -> PipelineOptions:
    """Options from our flags: ``aot_config.functorch.activation_memory_budget`` and solver."""
    from aot_config import functorch as functorch_flags

    return PipelineOptions(
        memory_budget=float(functorch_flags.activation_memory_budget),
        solver=str(functorch_flags.activation_memory_budget_solver),
    )


def make_partition_fn(options: PipelineOptions,
                      recorder: PartitionRecorder | None = None) -> PartitionFn:
    """aot_partition's min-cut partitioner run under ``options``' budget and solver."""

    def partition(joint_module: fx.GraphModule, joint_inputs: Sequence[Any],
                  **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        from aot_config import functorch as functorch_flags
        from aot_partition import min_cut_rematerialization_partition

        with functorch_flags.patch(activation_memory_budget=options.memory_budget,
                                   activation_memory_budget_solver=options.solver):
            forward, backward = min_cut_rematerialization_partition(
                joint_module, joint_inputs, **kwargs)
        if recorder is not None:
            recorder.record_forward(forward, backward, kwargs.get("num_fwd_outputs"))
        log.debug("partitioned a joint graph (budget %s, solver %s)",
                  options.memory_budget, options.solver)
        return forward, backward

    return partition


@cache
def _sources_digest() -> str:
    """A digest of the partitioner's and this package's sources, for Inductor's cache key."""
    import aot_partition

    digest = hashlib.sha256()
    for package_dir in (Path(aot_partition.__file__).parent, Path(__file__).parent):
        for path in sorted(package_dir.rglob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def _inductor_partitioner_class() -> type:
    base = _compat.custom_partitioner_base()

    class AotPipelinePartitioner(base):  # type: ignore[misc, valid-type]
        """Inductor's ``custom_partitioner_fn``: our partitioner in place of Inductor's."""

        def __init__(self, partition: PartitionFn, cache_key: Any) -> None:
            self.partition = partition
            self.cache_key = cache_key

        def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object],
                     **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
            return self.partition(gm, joint_inputs, **kwargs)

        def uuid(self) -> Any:
            return self.cache_key

    return AotPipelinePartitioner


def _inductor_backend(options: PipelineOptions, partition: PartitionFn,
                      recorder: PartitionRecorder | None) -> Callable[..., CompiledGraph]:
    def compile_with_inductor(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        from aot_config import functorch as functorch_flags

        # Inductor's caches key on the partitioner's uuid: our sources, options and flags.
        cache_key = (_sources_digest(), options.memory_budget, options.solver,
                     functorch_flags.get_hash().hex())
        config_patches: dict[str, Any] = {
            "custom_partitioner_fn": _inductor_partitioner_class()(partition, cache_key),
        }
        if recorder is not None:
            # A cache hit (AOTAutograd's or Inductor's) skips partitioning and the recorder
            # would see nothing; with the FX graph cache off both are bypassed. Kernels stay
            # cached.
            config_patches["fx_graph_cache"] = False
        return _compat.compile_fx()(gm, example_inputs, config_patches=config_patches)

    return compile_with_inductor


def _graph_compiler(name: str) -> Callable[..., Any]:
    import aot_compilers

    try:
        return getattr(aot_compilers, name)
    except AttributeError:
        raise ValueError(
            f"compiler {name!r} is not available from aot_compilers (installed version lacks it)"
        ) from None


def make_backend(options: PipelineOptions | None = None,
                 recorder: PartitionRecorder | None = None) -> Callable[..., CompiledGraph]:
    """A torch.compile back end (``gm, example_inputs -> callable``) for ``options``.

    ``recorder`` collects each partitioned forward graph, to measure the bytes it saves.
    """
    options = options if options is not None else default_options()
    partition = make_partition_fn(options, recorder)
    if options.compiler == "inductor":
        backend = _inductor_backend(options, partition, recorder)
    else:
        graph_compiler = _graph_compiler(options.compiler)

        def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
            # A fresh AOTAutograd back end per graph: it stores wrapped compilers on itself.
            return _compat.aot_autograd(
                fw_compiler=graph_compiler, bw_compiler=graph_compiler,
                partition_fn=partition, keep_inference_input_mutations=True,
            )(gm, example_inputs)

    backend.__name__ = f"aot_pipeline_{options.compiler}"
    return backend


def aot_pipeline_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                         options: dict[str, Any] | None = None,
                         mode: str | None = None) -> CompiledGraph:
    """``torch.compile(model, backend="aot_pipeline", options={...})``.

    ``options`` may set ``memory_budget``, ``solver`` and ``compiler``; unset ones come from
    ``aot_config.functorch`` (``activation_memory_budget``, ``activation_memory_budget_solver``)
    and compiler ``"inductor"``.
    """
    if mode not in (None, "default"):
        log.warning("aot_pipeline ignores torch.compile mode=%r", mode)
    if options and "compiled_autograd" in options:
        raise PipelineOptionError(
            "compiled_autograd cannot be set through torch.compile options (the backward runs "
            "outside the compiled graph); use aot_pipeline.compile(model, compiled_autograd=True)"
        )
    resolved = PipelineOptions.from_mapping(options, default_options())
    return make_backend(resolved)(gm, example_inputs)
