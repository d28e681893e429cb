"""The predicted peak of one training step, across every graph the step compiled to.

Each partitioned graph is priced by the memory model of the program that runs
(``aot_partition.memory_models``: Inductor's buffers for ``compiler="inductor"``, the unfused
model for the others) on the graphs as the partitioner returned them (Inductor rewrites the
graphs it compiles afterwards; the recorder keeps copies).

One graph: its modelled step (forward, then backward) is the step. Several graphs (graph
breaks): their forwards run in order, their backwards in reverse, so while graph ``k`` runs
the earlier graphs hold their saved activations, its own inputs that are not parameters were
made by the step (activations of an earlier graph; for the first graph, the batch, which is
allocated before the step), and the later graphs' parameter gradients may already be
allocated. The step's peak above what is allocated before it is the largest over ``k`` of
graph ``k``'s peak above its inputs plus those; the gradients are counted whole, so for
several graphs the number is an upper bound (by at most the later graphs' gradients, during
a graph's forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GraphPeak:
    """One graph's modelled step, in bytes."""

    index: int
    peak_bytes: int          # its absolute peak, its inputs included
    input_bytes: int         # its forward inputs (alive before it runs)
    parameter_bytes: int     # of which parameters and buffers (static lifetime)
    saved_bytes: int         # what its forward saves for its backward
    model: str               # "inductor" or "eager"

    @property
    def above_inputs(self) -> int:
        return self.peak_bytes - self.input_bytes


@dataclass(frozen=True)
class StepPeak:
    """The predicted peak of one step: ``above_inputs_bytes`` over what is allocated before
    the step (what the profiler's allocation events and ``max_memory_allocated`` after a
    reset measure), ``peak_bytes`` with the step's inputs (parameters, buffers, the batch)
    included, as a peak cap counts. ``graphs``: each graph's own modelled step."""

    graphs: tuple[GraphPeak, ...]
    above_inputs_bytes: int
    peak_bytes: int
    exact_model: bool        # one graph: the model's own number; several: an upper bound

    def describe(self) -> str:
        mib = 2**20
        kind = "" if self.exact_model else ", an upper bound across graph breaks"
        parts = "; ".join(f"graph {g.index}: {g.above_inputs / mib:.1f} MiB above its inputs, "
                          f"saves {g.saved_bytes / mib:.1f} MiB ({g.model})"
                          for g in self.graphs)
        return (f"predicted step peak {self.above_inputs_bytes / mib:.1f} MiB above the step's "
                f"inputs ({self.peak_bytes / mib:.1f} MiB with them{kind}); {parts}")


def price_graph(index: int, forward: Any, backward: Any, model: str,
                static_input_indices: Sequence[int] | None, allocator: str | None) -> GraphPeak:
    from aot_partition.memory_models.pricing import price_partition

    priced = price_partition(forward.graph, backward.graph, model,
                             static_input_indices=static_input_indices, owner=forward,
                             allocator=allocator, alignment=512 if allocator == "cuda" else 1)
    timeline = priced.timeline
    return GraphPeak(index, timeline.peak_bytes, timeline.baseline_bytes,
                     timeline.parameter_bytes, timeline.saved_bytes, priced.model)


def combine(graphs: Sequence[GraphPeak]) -> StepPeak:
    """The step's peak from its graphs' (see the module's docstring)."""
    if not graphs:
        raise ValueError("no graph was partitioned yet: run the compiled step once first")
    if len(graphs) == 1:
        only = graphs[0]
        return StepPeak(tuple(graphs), only.above_inputs, only.peak_bytes, True)
    parameters = [g.parameter_bytes for g in graphs]
    best = 0
    for k, graph in enumerate(graphs):
        made_inputs = graph.input_bytes - graph.parameter_bytes if k > 0 else 0
        held = sum(g.saved_bytes for g in graphs[:k])
        later_gradients = sum(parameters[k + 1:])
        best = max(best, graph.above_inputs + made_inputs + held + later_gradients)
    first = graphs[0]
    step_inputs = sum(parameters) + (first.input_bytes - first.parameter_bytes)
    return StepPeak(tuple(graphs), best, best + step_inputs, False)
