"""``aot_pipeline.compile``: torch.compile with the aot_pipeline back end and validated options."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .backend import make_backend, with_explicit_options
from .options import PipelineOptions, inductor_pairs
from .recording import PartitionRecorder

if TYPE_CHECKING:
    from .step_peak import StepPeak

log = logging.getLogger(__name__)


class CompiledModel:
    """A model compiled by the aot_pipeline back end.

    Call it like the model. ``backward(loss)`` runs the backward, through our compiled autograd
    when ``compiled_autograd=True`` (the backward starts outside the compiled graph, at
    ``loss.backward()``, so it must be entered there); ``partitions`` lists the forward graphs
    our partitioner made and ``saved_activation_bytes`` their saved bytes. With
    ``record_partitions=False`` Inductor's caches stay on (a warm restart loads the compiled
    graphs) and these list only the graphs partitioned in this process. Other attributes
    (``parameters()``, ``train()`` ...) are the model's.
    """

    def __init__(self, model: nn.Module | Callable[..., Any], options: PipelineOptions,
                 dynamic: bool | None, record_partitions: bool = True,
                 name: str | None = None) -> None:
        self.model = model
        self.options = options
        self.recorder = PartitionRecorder(bypass_caches=record_partitions)
        self.backend = make_backend(options, self.recorder, name=name, model=model)
        self.compiled = torch.compile(model, backend=self.backend, dynamic=dynamic)
        self._dynamic = dynamic

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names CompiledModel itself lacks: delegate to the model.
        return getattr(self.__dict__["model"], name)

    @property
    def partitions(self) -> list:
        return self.recorder.partitions

    @property
    def saved_activation_bytes(self) -> int | None:
        """Bytes the partitioned forward graphs save for backward (None before the first call)."""
        return self.recorder.saved_bytes

    def predicted_peak(self, model: str | None = None) -> StepPeak:
        """The predicted peak of one step across every graph it compiled to (``StepPeak``:
        ``above_inputs_bytes``, ``peak_bytes``, each graph's own; ``describe()``), priced by
        the memory model of the program that runs (``model``: ``"inductor"`` for
        ``compiler="inductor"``, else ``"eager"``) on the graphs as partitioned; see
        aot_pipeline.step_peak for how graphs of one step combine. Priced once per set of
        graphs (a recompile adds graphs: the step's newest compile is its last graphs).
        Needs the partitions recorded (``record_partitions=True``, the default) and one step
        run; ValueError otherwise."""
        from . import step_peak

        model = model or ("inductor" if self.options.compiler == "inductor" else "eager")
        recorded = [(p.as_partitioned, p.static_input_indices) for p in self.partitions
                    if p.as_partitioned is not None]
        key = (model, len(recorded))
        cached = self.__dict__.get("_predicted")
        if cached is not None and cached[0] == key:
            return cached[1]
        if not recorded:
            raise ValueError("no partition recorded yet: run the compiled step once (with "
                             "record_partitions=True, the default) before predicted_peak()")
        graphs = [step_peak.price_graph(i, fw, bw, model, static, _allocator_of(fw))
                  for i, ((fw, bw), static) in enumerate(recorded, 1)]
        found = step_peak.combine(graphs)
        self.__dict__["_predicted"] = (key, found)
        log.info("%s", found.describe())
        return found

    @contextlib.contextmanager
    def backward_context(self) -> Iterator[None]:
        """Wrap ``loss.backward()`` in this to run it through compiled autograd (if enabled)."""
        if not self.options.compiled_autograd:
            yield
            return
        import compiled_autograd

        # A new bound method each time, but compiled_autograd.same_compiler sees the same
        # function on this same CompiledModel: the engine keeps its cache across steps.
        with compiled_autograd.enable(self._backward_compiler):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        with self.backward_context():
            loss.backward()

    def _backward_compiler(self, graph: torch.fx.GraphModule) -> Callable[..., Any]:
        """compiled autograd's ``compiler_fn`` for the whole captured backward graph."""
        if self.options.compiler != "inductor":
            # Our graph compilers would run the captured graph as traced: skip the detour.
            return graph
        # The captured backward has no grad to take: the same back end compiles it for
        # inference. No split: a backward holds no loss to split (it would only warn so).
        return torch.compile(graph, backend=make_backend(replace(self.options, split=False)),
                             fullgraph=True, dynamic=self._dynamic)


def _allocator_of(forward: torch.fx.GraphModule) -> str | None:
    """"cuda" when the graph runs on CUDA (peaks counted in the caching allocator's blocks)."""
    for node in forward.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return "cuda" if val.device.type == "cuda" else None
    return None


def compile(  # noqa: A001 - mirrors torch.compile
    model: nn.Module | Callable[..., Any], *, memory_budget: float | str | None = None,
    solver: str | None = None,
    compiler: str = "inductor", compiled_autograd: bool = False, dynamic: bool | None = None,
    mode: str | None = None, options: dict[str, Any] | None = None,
    record_partitions: bool = True, memory_budget_best_effort: bool | None = None,
    defer_full_gc: bool = True, name: str | None = None, split: str | int | bool | None = None,
) -> CompiledModel:
    """Compile ``model`` with the aot_pipeline back end.

    ``memory_budget`` in [0, 1] is the fraction of activations the forward may save, a
    size such as ``"300MiB"``: a cap on the saved activation bytes, or a peak cap such as
    ``"20GiB peak"`` (the step's modelled peak, inputs included) or ``"0.8 peak"`` (a share of
    the uncapped peak); under dynamic shapes a cap is guarded at every shape (``solver`` picks
    the knapsack solver: dp, greedy, ilp, ilp_graph, dp_graph); ``compiler``
    compiles forward and backward (inductor, nop, debug_nop, print_compile, ts_compile);
    ``compiled_autograd`` runs ``CompiledModel.backward`` through our compiled autograd;
    ``dynamic`` is torch.compile's. ``mode`` ("default", "reduce-overhead", "max-autotune",
    "max-autotune-no-cudagraphs") and ``options`` (``torch._inductor.config`` settings) reach
    Inductor as with ``torch.compile(backend="inductor")``; unlike there, both may be given.
    ``memory_budget``, ``solver`` and ``memory_budget_best_effort`` left out come from the
    partitioner flags (``aot_config.functorch``'s, or torch's ``torch._functorch.config`` one of
    the same name; both set and different: ``FlagConflictError``); given, they must agree with
    any such flag that is set, else ``OptionFlagConflictError``: nothing is dropped silently.
    ``record_partitions`` (default True) keeps every partition in ``partitions`` by keeping
    Inductor's FX graph and AOTAutograd caches off for these graphs; False keeps the caches on,
    as ``torch.compile(backend="aot_pipeline")`` does, so a second process starts warm.
    A byte cap no cut reaches fails the compile with ``UnreachableMemoryBudgetError`` (naming
    the least reachable size; torch.compile wraps it); ``memory_budget_best_effort=True`` takes
    the closest cut instead, with a ``MemoryBudgetBestEffortWarning`` saying what it saved.
    ``defer_full_gc`` (default True) defers full garbage collections while a graph compiles
    (``aot_pipeline.gc_deferral``). ``name`` names the model's compiled region, as
    ``torch.compile(..., name=)`` does (torch 2.13 on; the compiled-autograd backward stays
    unnamed). ``split`` computes the LM head and its cross-entropy in chunks of tokens
    (``"auto"``: only when a peak cap is unreachable otherwise; ``False``: never; ``N``: always,
    N chunks; left out: ``aot_config.functorch.activation_token_split``); what was split is
    in ``recorder.splits``. Bad values raise ``PipelineOptionError`` (a ValueError).
    """
    if not callable(model):
        raise TypeError(f"compile() needs an nn.Module or a callable, got {type(model).__name__}")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be None, True or False, got {dynamic!r}")
    if not isinstance(record_partitions, bool):
        raise TypeError(f"record_partitions must be True or False, got {record_partitions!r}")
    flagged = {"memory_budget": memory_budget, "solver": solver,
               "memory_budget_best_effort": memory_budget_best_effort, "split": split}
    pipeline_options = with_explicit_options({
        **{name: value for name, value in flagged.items() if value is not None},
        "compiler": compiler, "compiled_autograd": compiled_autograd, "mode": mode,
        "inductor_options": inductor_pairs(options or {}), "defer_full_gc": defer_full_gc})
    return CompiledModel(model, pipeline_options, dynamic, record_partitions, name)
