"""A peak cap on the whole step, across its graphs (issue 50, item 5).

``memory_budget="X peak"`` / ``"f peak"`` bounds the step as ``step_peak.combine`` prices it:
while graph ``k`` runs, the earlier graphs hold their saved activations and their parameters,
the batch is alive, and the later graphs' parameters (and, as ``combine`` counts them, their
gradients) are allocated. Each graph is partitioned under its own absolute cap derived from
the step's, when it compiles: Dynamo compiles graphs one at a time, in the order the step
runs them (graph ``k + 1`` after graph ``k`` has been partitioned and has run its forward).

- An absolute cap ``X``: graph ``k``'s own modelled peak (its inputs included) is capped at
  ``X - offset_k``, where ``offset_k`` = the saved activations of the earlier graphs as they
  were partitioned + their parameters + the batch (for ``k > 1``) + twice the bytes of the
  model's parameters and buffers no graph has read yet (the later graphs': themselves and
  their gradients). So each graph's point of the step, as ``combine`` counts it, is at most
  ``X``: ``CompiledModel.predicted_peak()`` (an upper bound across graph breaks) stays within
  the cap. The later graphs' share is known only when an ``nn.Module`` was compiled; a
  function's later graphs are unknown when the first compiles (reserved as 0, said in the
  log), and a parameter read by several graphs is reserved once where ``combine`` counts it
  per graph.
- A fraction ``f``: of the step's uncapped peak as far as it is known. Graph ``k``'s cap is
  ``f * U_k - offset_k``, ``U_k`` the largest uncapped point of graphs ``1..k`` (each graph
  partitioned without a cap and priced, the earlier graphs counted uncapped too). ``U_k`` only
  grows with ``k``, so an earlier graph was held to at least the share the final step asks:
  the bound holds for the whole step. The first graph of a step, with nothing to reserve,
  keeps the partitioner's own fraction (and its guards under dynamic shapes).

Under the Inductor model and with ``record_partitions=False`` a graph found in a cache is
not partitioned in this process: what it holds is unknown to the later graphs (logged).
A recompile (the same Dynamo frame again) restarts the step from that graph.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from aot_partition import UnreachableMemoryBudgetError

log = logging.getLogger(__name__)
MIB = 2**20


@dataclass(frozen=True)
class StepContext:
    """What graph ``graph`` of a step is capped by (pickled into the partitioner's cache key:
    the partition it makes is a function of these and the joint)."""

    graph: int                    # 1-based, in the order the step runs its graphs
    step_peak_bytes: int | None   # the step's absolute cap
    step_fraction: float | None   # or its share of the uncapped step
    offset_bytes: int             # what the step holds beside this graph while it runs
    offset_uncapped_bytes: int    # the same with the earlier graphs uncapped
    reference_bytes: int          # the uncapped step's largest point over the earlier graphs

    @property
    def partitioner_fraction(self) -> bool:
        """The partitioner's own fraction applies (the first graph, nothing to reserve)."""
        return self.step_fraction is not None and self.graph == 1 and self.offset_bytes == 0

    def graph_limit(self, top: int) -> int:
        """Graph's own absolute peak cap for a fraction, ``top`` its uncapped modelled peak."""
        assert self.step_fraction is not None
        reference = max(self.reference_bytes, top + self.offset_uncapped_bytes)
        return int(self.step_fraction * reference) - self.offset_bytes


@dataclass
class GraphSink:
    """Filled by the partition function while one graph compiles (not pickled): the first
    joint's uncapped modelled peak and saved bytes (a fraction cap's reference), or the joint
    itself to price later."""

    top: int | None = None
    uncapped_saved: int | None = None
    joint: Any = None             # (joint, inputs, kwargs) kept for a lazy reference
    limit: int | None = None      # the absolute cap the graph was partitioned under


_CURRENT: contextvars.ContextVar[tuple[StepContext, GraphSink] | None] = \
    contextvars.ContextVar("aot_pipeline_step_context", default=None)


def current() -> tuple[StepContext, GraphSink] | None:
    """The step context of the graph being compiled now, if a step cap applies."""
    return _CURRENT.get()


@contextlib.contextmanager
def compiling(context: StepContext | None, sink: GraphSink) -> Iterator[None]:
    token = _CURRENT.set(None if context is None else (context, sink))
    try:
        yield
    finally:
        _CURRENT.reset(token)


@dataclass
class _Graph:
    frame: int
    context: StepContext
    parameter_bytes: int
    batch_bytes: int
    sink: GraphSink
    ids: frozenset[int] = frozenset()  # its parameters' and buffers' ids
    saved_bytes: int | None = None   # None: not partitioned here (a cache hit)
    left_alone: list[str] = field(default_factory=list)
    model: str = "inductor"
    split_tried: bool = False        # a loss site the split could take was found
    split_off: bool = False          # a loss site was found, but split=False
    break_reason: str | None = None  # the graph ends at a graph break: Dynamo's reason
    returns_projection: str | None = None  # it returns a projection's output at the break

    @property
    def part_of_many(self) -> bool:
        """Whether the step has other graphs than this one, as far as known now."""
        return self.context.graph > 1 or self.context.offset_bytes > 0 \
            or self.break_reason is not None

    def reference(self) -> tuple[int, int] | None:
        """(uncapped peak, uncapped saved bytes), priced now if only the joint was kept."""
        if self.sink.top is None and self.sink.joint is not None:
            joint, inputs, kwargs = self.sink.joint
            self.sink.top, self.sink.uncapped_saved = uncapped_price(joint, inputs, kwargs,
                                                                     self.model)
            self.sink.joint = None
        if self.sink.top is None or self.sink.uncapped_saved is None:
            return None
        return self.sink.top, self.sink.uncapped_saved


def uncapped_price(joint: Any, inputs: Sequence[Any], kwargs: dict[str, Any],
                   model: str) -> tuple[int, int]:
    """A joint's runtime-optimal cut (budget 1.0, no cap): its modelled peak, inputs
    included, and its saved bytes."""
    from aot_config import functorch as functorch_flags
    from aot_partition import min_cut_rematerialization_partition, saved_activation_bytes
    from aot_partition.memory_models.pricing import price_partition

    with functorch_flags.patch(activation_memory_budget=1.0,
                               activation_memory_budget_bytes=None,
                               activation_memory_peak_bytes=None,
                               activation_memory_peak_fraction=None):
        forward, backward = min_cut_rematerialization_partition(joint, inputs, **kwargs)
    static = kwargs.get("static_lifetime_input_indices")
    priced = price_partition(forward.graph, backward.graph, model, static_input_indices=static,
                             owner=forward)
    return priced.timeline.peak_bytes, saved_activation_bytes(forward,
                                                              kwargs.get("num_fwd_outputs"))


def _static(value: Any) -> bool:
    return isinstance(value, torch.nn.Parameter) or \
        getattr(value, "_dynamo_static_input_type", None) is not None


def _nbytes(value: torch.Tensor) -> int:
    from aot_partition.fx.sizes import tensor_nbytes

    return tensor_nbytes(value)


def _break_reason(gm: Any) -> str | None:
    """Dynamo's reason when ``gm`` ends at a graph break (more graphs follow), else None."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    text = " ".join(str(reason.reason).split())
    stack = getattr(reason, "user_stack", None) or []
    where = f" at {stack[-1].filename.rsplit('/', 1)[-1]}:{stack[-1].lineno}" if stack else ""
    return f"{text[:160]}{where}"


_PROJECTIONS = ("linear", "matmul", "addmm", "mm")


def _returned_projection(gm: Any) -> str | None:
    """The name of a projection (linear, matmul) whose output ``gm`` returns, if any."""
    import torch.fx as fx

    for node in gm.graph.find_nodes(op="output"):
        for value in _flat(node.args):
            while isinstance(value, fx.Node) and value.op == "call_method" \
                    and value.target in ("view", "reshape", "contiguous"):
                value = value.args[0]
            if isinstance(value, fx.Node) and value.op == "call_function" and \
                    getattr(value.target, "__name__", "") in _PROJECTIONS:
                return value.name
    return None


def _flat(args: Any) -> list[Any]:
    if isinstance(args, (list, tuple)):
        return [x for a in args for x in _flat(a)]
    return [args]


class StepPeakUnreachableError(UnreachableMemoryBudgetError):
    """The step's peak cap is unreachable at one of its graphs: the message names every
    graph's floor (its least point of the step as far as known) and what blocks a lower one.
    ``least`` is the step's floor at the graph that failed, ``graph`` its 1-based index."""

    def __init__(self, what: str, cap: int, least: int, least_label: str, message: str,
                 graph: int = 0) -> None:
        super().__init__(what, cap, least, least_label, "peak at")
        self.graph = graph
        self.args = (message,)
        self._message = message

    def __str__(self) -> str:
        return self._message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.what, self.cap, self.least, self.least_label,
                             self._message, self.graph))


class StepCap:
    """The graphs of one step, as they compile, and each one's share of the step's cap."""

    def __init__(self, peak_bytes: int | None, peak_fraction: float | None,
                 model: Any = None, memory_model: str = "inductor") -> None:
        self.peak_bytes = peak_bytes
        self.peak_fraction = peak_fraction
        self.memory_model = memory_model
        self.graphs: list[_Graph] = []
        # The model's parameters and buffers (id -> bytes), when an nn.Module is compiled.
        self.statics: dict[int, int] | None = None
        if isinstance(model, torch.nn.Module):
            self.statics = {id(t): _nbytes(t) for t in
                            (*model.parameters(), *model.buffers())}
        self._seen: set[int] = set()

    @property
    def active(self) -> bool:
        return self.peak_bytes is not None or self.peak_fraction is not None

    def begin(self, gm: Any, example_inputs: Sequence[Any], left_alone: Sequence[Any],
              split_tried: bool = False, split_off: bool = False) -> _Graph:
        """The next graph of the step, ``gm`` (a recompile of a frame restarts the step
        there)."""
        from torch._guards import CompileContext

        compile_id = CompileContext.current_compile_id()
        frame = -1
        if compile_id is not None and compile_id.frame_id is not None:
            frame = compile_id.frame_id
        frames = [g.frame for g in self.graphs]
        if frame in frames or frame == -1:
            del self.graphs[frames.index(frame) if frame in frames else 0:]
            self._seen = set().union(*(g.ids for g in self.graphs))
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        statics = [t for t in tensors if _static(t)]
        parameter_bytes = sum(_nbytes(t) for t in statics)
        batch_bytes = sum(_nbytes(t) for t in tensors if not _static(t))
        ids = {id(t) for t in statics}
        self._seen |= ids
        k = len(self.graphs) + 1
        earlier = self.graphs
        held = sum(g.saved_bytes or 0 for g in earlier)
        earlier_parameters = sum(g.parameter_bytes for g in earlier)
        batch = earlier[0].batch_bytes if earlier else 0
        later = 0
        if self.statics is not None:
            later = 2 * sum(n for i, n in self.statics.items() if i not in self._seen)
        offset = held + earlier_parameters + batch + later
        held_uncapped = 0
        reference = 0
        if self.peak_fraction is not None:
            for g in earlier:
                priced = g.reference()
                if priced is None:
                    log.info("graph %d of the step was not partitioned in this process (a "
                             "cache hit): the step's uncapped reference leaves it out",
                             g.context.graph)
                    continue
                top, saved = priced
                reference = max(reference, top + g.context.offset_uncapped_bytes)
                held_uncapped += saved
        context = StepContext(k, self.peak_bytes, self.peak_fraction, offset,
                              held_uncapped + earlier_parameters + batch + later, reference)
        graph = _Graph(frame, context, parameter_bytes, batch_bytes if k == 1 else 0,
                       GraphSink(), frozenset(ids), left_alone=[f"{a.loss}: {a.reason}" for a in left_alone],
                       model=self.memory_model, split_tried=split_tried, split_off=split_off,
                       break_reason=_break_reason(gm),
                       returns_projection=_returned_projection(gm))
        self.graphs.append(graph)
        if k > 1 or later:
            log.info("step peak cap, graph %d: %.1f MiB held beside it (earlier graphs' saved "
                     "%.1f MiB and parameters %.1f MiB, the batch %.1f MiB, later graphs' "
                     "parameters and gradients %.1f MiB%s)", k, offset / MIB, held / MIB,
                     earlier_parameters / MIB, batch / MIB, later / MIB,
                     "" if self.statics is not None else
                     ": unknown, a function was compiled, not an nn.Module")
        return graph

    def graph_peak_bytes(self, graph: _Graph) -> int | None:
        """Graph's own absolute cap, for an absolute step cap (None for a fraction)."""
        if self.peak_bytes is None:
            return None
        return self.peak_bytes - graph.context.offset_bytes

    def commit(self, graph: _Graph, partitions: Sequence[Any]) -> None:
        """What the chosen compile of ``graph`` saves (held while the later graphs run)."""
        with_backward = [p for p in partitions if p.backward is not None]
        if not with_backward:
            log.info("graph %d of the step was not partitioned in this process (a cache hit, "
                     "or no backward): the later graphs do not count what it saves",
                     graph.context.graph)
            return
        graph.saved_bytes = sum(p.saved_bytes for p in with_backward)

    def refusal(self, graph: _Graph, error: Any) -> StepPeakUnreachableError:
        """The step's refusal at ``graph``: each graph's floor and what blocks a lower one."""
        k = graph.context.graph
        offset = graph.context.offset_bytes
        floor = error.least + offset if error.least is not None else offset
        cap = self.peak_bytes if self.peak_bytes is not None else error.cap + offset
        what = (f"step peak cap {cap} bytes" if self.peak_fraction is None else
                f"step peak cap {self.peak_fraction:g} of the uncapped step ({cap} bytes "
                "here)")
        parts = []
        for g in self.graphs[:k - 1]:
            held = "unknown (not partitioned here)" if g.saved_bytes is None \
                else f"{g.saved_bytes / MIB:.1f} MiB"
            parts.append(f"graph {g.context.graph}: fits; holds its saved activations "
                         f"({held}) and parameters ({g.parameter_bytes / MIB:.1f} MiB) while "
                         "the later graphs run")
        parts.append(f"graph {k}: floor {floor / MIB:.1f} MiB of the step ({error.least} "
                     f"bytes its own least peak, the {error.least_label} cut, + "
                     f"{offset / MIB:.1f} MiB held beside it by the rest of the step)")
        blocks = [f"graph {g.context.graph}: {reason}" for g in self.graphs[:k]
                  for reason in g.left_alone]
        if any("graph break" in b for b in blocks):
            lead = "the split is blocked by a graph break between the projection and the loss"
        elif blocks:
            lead = "the split is blocked"
        elif graph.split_tried:
            lead = (f"graph {k}'s loss was split (the most chunks, then recomputing the "
                    "logits) and still does not fit")
        elif graph.split_off:
            lead = (f"graph {k}'s loss is not split (split=False: the split would lower its "
                    "floor)")
        else:
            lead = f"graph {k} has no LM head and loss to split"
        if self.peak_fraction is not None and graph.context.reference_bytes == 0:
            lead += (f"; a share of the step is of its uncapped peak as known when graph {k} "
                     "compiles (the later graphs are not compiled yet): a cap in bytes lets it "
                     "use the room a later graph's higher peak makes")
        if graph.break_reason is not None and graph.returns_projection is not None:
            lead += (f"; graph {k} ends at a graph break ({graph.break_reason}) and returns "
                     f"the projection {graph.returns_projection}: if a loss reads it after the "
                     "break, the split cannot reach that loss (a graph break between the "
                     "projection and the loss)")
        elif graph.break_reason is not None:
            lead += f"; graph {k} ends at a graph break ({graph.break_reason})"
        if k > 1:
            lead += (f"; the earlier graphs hold {offset / MIB:.1f} MiB through graph "
                     f"{k} (a graph break keeps their saved activations alive)")
            saved = sum(g.saved_bytes or 0 for g in self.graphs[:k - 1])
            room = saved - (floor - cap)
            if saved and room >= 0:
                lead += (f": graph {k} would fit if they saved {room / MIB:.1f} MiB instead of "
                         f"{saved / MIB:.1f} MiB, but their graphs were partitioned first, each "
                         "the fastest within its share of the cap, and have run (a lower cap "
                         "makes them save less)")
        why = f"{lead}" + (f" ({'; '.join(blocks)})" if blocks else "")
        count = (f"the step's {k} graphs so far" if k > 1 else "graph 1 of the step (the "
                 "graphs after it are not compiled yet)")
        message = (f"{what} is unreachable at {count}: {'; '.join(parts)}. What blocks a "
                   f"lower floor: {why}")
        return StepPeakUnreachableError(what, cap, floor, error.least_label, message, k)
