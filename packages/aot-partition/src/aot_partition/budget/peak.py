"""The measure of a peak cap: a cut's modelled forward+backward peak (``SimulatedPeak``), the
absolute high-water mark of one step as the memory model of the program that runs prices it
(memory_models/), with the cut's estimated runtimes. Results are cached by saved set, so one
search prices each cut once; the chosen cut's graphs are handed to the partition."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ..costs.cut_runtime import NodeEstimates, recompute_estimate, step_estimate
from ..fx.cut import CutGraphs, extract_cut, finish_cut, split_saved
from ..fx.extract import CutPlan, plan_cut
from ..fx.joint import is_bwd_seed_offset
from .candidates import CutCandidate

if TYPE_CHECKING:
    from ..memory_models.simulator import MemoryTimeline

log = logging.getLogger(__name__)

__all__ = ["INDUCTOR_PRICINGS", "KEPT_CUT_GRAPHS", "SOFT_BOUND_MARGIN", "CutMeasure",
           "SimulatedPeak"]


@dataclass(frozen=True)
class CutMeasure:
    """What ``SimulatedPeak`` measured of one cut."""

    peak_bytes: int                          # the absolute modelled peak (inputs included)
    baseline_bytes: int                      # of which, forward inputs alive before the step
    recompute_runtime: float | None = None   # see recompute_estimate; None without estimator
    step_runtime: float | None = None        # see step_estimate; None without estimator
    model: str = "eager"                     # the memory model that priced it (memory_models)
    # Under dynamic shapes, the absolute peak at every shape is the largest of these
    # (memory_models/symbolic_peak.py); empty when static.
    peak_expressions: tuple[Any, ...] = ()


# How many measured cuts' graphs a SimulatedPeak keeps for the partition to take (the
# reference check measures at most three).
KEPT_CUT_GRAPHS = 4
# Under the Inductor model a cut is not lowered when its eager peak, scaled by the largest
# saving fusion made on any cut lowered so far, times this, is over the cap (``soft_bound``).
SOFT_BOUND_MARGIN = 0.95
# Candidate cuts a peak cap prices with the Inductor model in each phase of its search
# (choose_candidate's ``max_measured``): a tight cap lowers at most twice this many.
INDUCTOR_PRICINGS = 6


@dataclass
class SimulatedPeak:
    """The measure of a peak cap: a cut's modelled forward+backward peak, in bytes.

    Absolute: what is live at the step's high-water mark, forward inputs (the batch,
    parameters and buffers), user outputs, saved values, tangents, temporaries and gradients
    included. ``model`` says how the step is modelled (memory_models/pricing.py): ``"eager"``
    (``memory.simulate_partition``: every FX value materialized, fx-level) or ``"inductor"``
    (the buffers Inductor's compiled graphs allocate, found by lowering them). The graphs are
    the partition's own (``extract_cut`` + ``finish_cut``). ``static_input_indices`` label
    parameters (they are resident either way). Results are cached by saved set, so one search
    measures each cut once; ``estimator`` also estimates each cut's recompute runtime
    (``recompute_estimate``, the Pareto sweep's y) and its step runtime (``step_estimate``,
    what reference.py compares and a peak cap orders candidates by), which need the cut's
    graphs but not its price.
    """

    joint_module: fx.GraphModule
    num_fwd_outputs: int
    static_input_indices: tuple[int, ...] | None = None
    estimator: str | None = None
    model: str = "eager"
    _measured: dict[frozenset[fx.Node], CutMeasure] = field(default_factory=dict, repr=False)
    # Runtime estimates of each cut whose graphs were extracted: (recompute, step).
    _runtimes: dict[frozenset[fx.Node], tuple[float, float]] = field(default_factory=dict,
                                                                      repr=False)
    # The finished graphs of recent cuts, by saved set (with the saved list's order): the
    # partition takes the chosen one's instead of extracting it again (``take_graphs``).
    _graphs: dict[frozenset[fx.Node], tuple[tuple[fx.Node, ...], CutGraphs]] = field(
        default_factory=dict, repr=False)
    _estimates: NodeEstimates | None = field(default=None, repr=False)
    _input_bytes: int | None = field(default=None, repr=False)
    # Why the asked model could not price a cut (memory_models.Priced.fallback), if it could not.
    fallbacks: list[str] = field(default_factory=list, repr=False)
    # Inductor model: each priced cut's peak over its eager (unfused) peak, and eager peaks.
    _fusion_ratios: list[float] = field(default_factory=list, repr=False)
    _eager: dict[frozenset[fx.Node], int] = field(default_factory=dict, repr=False)
    # The plans of recent cuts, by saved set (with the saved list's order): see ``plan``.
    _plans: dict[frozenset[fx.Node], tuple[tuple[fx.Node, ...], CutPlan]] = field(
        default_factory=dict, repr=False)
    # The joint nodes' output sizes, found once for every cut simulated on its plan.
    _leaf_facts: dict[fx.Node, Any] = field(default_factory=dict, repr=False)

    def __call__(self, candidate: CutCandidate) -> int:
        return self.of(candidate.saved).peak_bytes

    def step_runtime(self, candidate: CutCandidate) -> float:
        """The candidate's estimated step (``step_estimate``; needs ``estimator``)."""
        return self.runtimes(candidate.saved)[1]

    @property
    def model_words(self) -> str:
        """How the peak is modelled, for messages: "simulated" (eager) or "Inductor-modelled"."""
        return "Inductor-modelled memory" if self.model == "inductor" else "simulated memory"

    @property
    def alignment(self) -> int:
        """Allocation granularity of the joint's device: 512 bytes for CUDA's caching
        allocator (what ``max_memory_allocated`` counts), 1 elsewhere."""
        return 512 if self.allocator == "cuda" else 1

    @property
    def allocator(self) -> str | None:
        """"cuda" when the joint runs on CUDA: peaks are counted in the caching allocator's
        blocks, as ``max_memory_allocated`` counts them (memory_models/caching_allocator.py)."""
        for node in self.joint_module.graph.find_nodes(op="placeholder"):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                return "cuda" if val.device.type == "cuda" else None
        return None

    @property
    def input_bytes(self) -> int:
        """Bytes of the step's forward inputs (each storage once): alive before the step."""
        if self._input_bytes is None:
            from ..fx.joint import is_tangent as _is_tangent
            from ..fx.sizes import storage_key, storage_nbytes, value_leaves

            seen: set[Any] = set()
            total = 0
            for node in self.joint_module.graph.find_nodes(op="placeholder"):
                if _is_tangent(node) or is_bwd_seed_offset(node):
                    continue
                for t in value_leaves(node.meta.get("val")):
                    key = storage_key(t) if hasattr(t, "untyped_storage") else None
                    if key is None or key in seen:
                        continue
                    seen.add(key)
                    total += storage_nbytes(t)
            self._input_bytes = total
        return self._input_bytes

    def soft_bound(self, saved: Sequence[fx.Node]) -> int:
        """A cheap estimate below the cut's Inductor-modelled peak: its eager peak times the
        least Inductor/eager ratio of the cuts lowered so far, times ``SOFT_BOUND_MARGIN``
        (0 under the eager model, or before any cut is lowered). Not a proof: a cut whose
        fusion saves more than any seen may be skipped (a slower cut is chosen, never one over
        the cap: the chosen cut is always priced)."""
        if self.model != "inductor" or not self._fusion_ratios:
            return 0
        return int(self._eager_peak(saved) * min(self._fusion_ratios) * SOFT_BOUND_MARGIN)

    def _eager_peak(self, saved: Sequence[fx.Node]) -> int:
        key = frozenset(saved)
        if key not in self._eager:
            # The unfused graphs' own buffers (no op scratch): the soft bound's base.
            self._eager[key] = self._eager_timeline(saved, scratch=False).peak_bytes
        return self._eager[key]

    def _eager_timeline(self, saved: Sequence[fx.Node], scratch: bool = True
                        ) -> MemoryTimeline:
        """The eager model's peak of the cut (no per-step records), simulated on its plan
        (no node copied) unless the passes would change its graphs (an RNG replay): then on
        its finished graphs. ``scratch``: count the chunked ops' scratch, as the eager model
        does (memory.split_op_workspace)."""
        from ..memory_models.simulator import simulate_partition, simulate_plan, split_op_workspace

        options: dict[str, Any] = {
            "static_input_indices": self.static_input_indices, "alignment": self.alignment,
            "allocator": self.allocator, "record_steps": False,
            "workspace": split_op_workspace if scratch else None}
        timeline = simulate_plan(self.joint_module.graph, self._plan(saved),
                                 facts=self._leaf_facts, **options)
        if timeline is not None:
            return timeline
        cut = self._cut(saved)
        return simulate_partition(cut.fw, cut.bw, **options)

    def plan(self, saved: Sequence[fx.Node]) -> CutPlan | None:
        """The plan of exactly ``saved`` (same order) if this simulator made it recently: the
        partition extracts the chosen cut from it instead of planning it again."""
        found = self._plans.get(frozenset(saved))
        return found[1] if found is not None and found[0] == tuple(saved) else None

    def _plan(self, saved: Sequence[fx.Node]) -> CutPlan:
        """The cut's plan (extract.plan_cut), its runtimes estimated from it."""
        key = frozenset(saved)
        plan = self.plan(saved)
        if plan is None:
            saved_sym_nodes, saved_values = split_saved(saved)
            plan = plan_cut(self.joint_module, saved_values, saved_sym_nodes,
                            num_fwd_outputs=self.num_fwd_outputs)
            if len(self._plans) >= KEPT_CUT_GRAPHS:  # a peak cap may plan many: keep the last
                del self._plans[next(iter(self._plans))]
            self._plans[key] = (tuple(saved), plan)
        if self.estimator is not None and key not in self._runtimes:
            graph = self.joint_module.graph
            fw, bw = plan.fw_nodes(graph), plan.bw_nodes(graph)
            if self._estimates is None:
                self._estimates = NodeEstimates(self.estimator)
            self._runtimes[key] = (recompute_estimate(fw, bw, self.estimator, self._estimates),
                                   step_estimate(fw, bw, self.estimator, self._estimates))
        return plan

    @property
    def simulations(self) -> int:
        """How many cuts were priced so far."""
        return len(self._measured)

    def of(self, saved: Sequence[fx.Node]) -> CutMeasure:
        """The measure of the cut that saves ``saved`` (cached)."""
        key = frozenset(saved)
        found = self._measured.get(key)
        if found is None:
            found = self._measured[key] = self._measure(saved)
        return found

    def runtimes(self, saved: Sequence[fx.Node]) -> tuple[float, float]:
        """(recompute, step) estimates of the cut that saves ``saved`` (cached; needs
        ``estimator``): its graphs are extracted, not priced."""
        if self.estimator is None:
            raise ValueError("SimulatedPeak.step_runtime needs an estimator")
        key = frozenset(saved)
        if key not in self._runtimes:
            self._plan(saved)
        return self._runtimes[key]

    def take_graphs(self, saved: Sequence[fx.Node]) -> CutGraphs | None:
        """The finished graphs this simulator built for exactly ``saved`` (same order), handed
        over once (the caller owns them: they are not simulated again); None if not built."""
        key = frozenset(saved)
        found = self._graphs.get(key)
        if found is None or found[0] != tuple(saved):
            return None
        del self._graphs[key]
        return found[1]

    def _cut(self, saved: Sequence[fx.Node]) -> CutGraphs:
        """The cut's finished graphs (kept for ``take_graphs``), its runtimes estimated."""
        key = frozenset(saved)
        found = self._graphs.get(key)
        if found is not None and found[0] == tuple(saved):
            return found[1]
        cut = extract_cut(self.joint_module, saved, num_fwd_outputs=self.num_fwd_outputs,
                          plan=self.plan(saved))
        if self.estimator is not None and key not in self._runtimes:
            if self._estimates is None:
                self._estimates = NodeEstimates(self.estimator)
            self._runtimes[key] = (
                recompute_estimate(cut.fw, cut.bw, self.estimator, self._estimates),
                step_estimate(cut.fw, cut.bw, self.estimator, self._estimates))
        finish_cut(cut)
        if len(self._graphs) >= KEPT_CUT_GRAPHS:  # a peak cap may measure many: keep the last
            del self._graphs[next(iter(self._graphs))]
        self._graphs[key] = (tuple(saved), cut)
        return cut

    def _measure(self, saved: Sequence[fx.Node]) -> CutMeasure:
        from ..memory_models.pricing import price_partition

        if self.model == "eager":  # the same model price_partition runs, on the plan
            timeline, model = self._eager_timeline(saved), "eager"
        else:
            cut = self._cut(saved)
            priced = price_partition(cut.fw, cut.bw, self.model,
                                     static_input_indices=self.static_input_indices,
                                     owner=self.joint_module, alignment=self.alignment,
                                     allocator=self.allocator, record_steps=False)
            if priced.fallback is not None:
                self.fallbacks.append(priced.fallback)
            timeline, model = priced.timeline, priced.model
            if model == "inductor":
                eager = self._eager_peak(saved)
                if eager > 0:
                    self._fusion_ratios.append(timeline.peak_bytes / eager)
        recompute, step = self._runtimes.get(frozenset(saved), (None, None))
        log.debug("%s peak %d bytes (%d before the step) for %d saved values", model,
                  timeline.peak_bytes, timeline.baseline_bytes, len(saved))
        return CutMeasure(timeline.peak_bytes, timeline.baseline_bytes, recompute, step,
                          model, timeline.peak_expressions)
