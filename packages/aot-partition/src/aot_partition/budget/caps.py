"""Budgets in bytes: a fixed set of candidate cuts and the caps that choose among them.

A budget in bytes (``activation_memory_budget_bytes``, ``within_bytes``) picks one of a fixed
set of candidate cuts (``cut_candidates``: the runtime-optimal cut and the cuts at the fractions
of ``BYTE_BUDGET_FRACTIONS``, under the search's estimator and the reference estimator, made by
budget.py's ``BudgetSearch``) with ``choose_candidate``; the measure compared with the cap is a
function of a candidate (``activation_bytes`` by default).

A cap on the simulated peak (``activation_memory_peak_bytes``, ``SimulatedPeak``) picks from the
same candidates with the same rule; the measure is the absolute peak of one forward+backward
step as memory.py simulates it, inputs and parameters included (``within_caps`` takes both caps
at once), and the fitting candidates are ordered by the simulation's step estimate.
Candidates are simulated only when such a cap is set.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node

from ..errors import UnreachableMemoryBudgetError
from ..fx.estimators import SignatureMemo, estimate_runtime
from ..fx.extract import (
    CutPlan,
    backward_live_nodes,
    extract_forward_backward_graphs,
    is_assert_only_symbool,
    plan_cut,
)
from ..fx.joint import is_bwd_seed_offset, is_random, is_tangent
from ..fx.passes import reorder_backward, replay_random_ops
from ..fx.passes.rng import device_of, rng_state_nbytes
from ..fx.sizes import saved_bytes
from .search import BudgetSearch

if TYPE_CHECKING:
    from ..fx.memory import MemoryTimeline

log = logging.getLogger(__name__)

__all__ = [
    "BYTE_BUDGET_FRACTIONS",
    "Cap",
    "CutCandidate",
    "CutGraphs",
    "CutMeasure",
    "SimulatedPeak",
    "activation_bytes",
    "byte_cap",
    "candidate",
    "choose_candidate",
    "choose_under_caps",
    "cut_candidates",
    "extract_cut",
    "finish_cut",
    "peak_cap",
    "recompute_estimate",
    "step_estimate",
    "validate_memory_budget_bytes",
    "validate_peak_bytes",
    "within_bytes",
    "within_caps",
]


def validate_memory_budget_bytes(cap: int) -> int:
    """``cap`` as an int; ValueError unless it is a whole number of bytes, 0 or more."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ValueError(f"activation memory budget in bytes must be an int >= 0; got {cap!r}")
    return cap


def validate_peak_bytes(cap: int) -> int:
    """``cap`` as an int; ValueError unless it is a whole number of bytes, 0 or more."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ValueError(f"activation memory peak in bytes must be an int >= 0; got {cap!r}")
    return cap


# Fractions whose cuts are the byte budget's candidates (1, 31/32, ..., 1/32, 0). Fixed, so
# every cap chooses from one set: a lower cap never saves more (see choose_candidate).
BYTE_BUDGET_FRACTIONS = tuple(i / 32 for i in range(32, -1, -1))


@dataclass(frozen=True)
class CutCandidate:
    """One cut a byte budget may choose: what it saves, and what the backward then does."""

    label: str                        # "runtime-optimal", "budget 0.5", "inputs only", ...
    rank: int                         # place in the search's order; 0: the runtime-optimal cut
    saved: tuple[fx.Node, ...]        # the saved set as the search chose it
    read: tuple[fx.Node, ...]         # of those, what the backward reads (what is kept)
    recomputed: frozenset[fx.Node]    # forward nodes the backward computes again
    # Estimated runtime of the knapsack items (nodes banned even under aggressive options)
    # this cut recomputes and the runtime-optimal cut does not; 0 for the runtime-optimal cut.
    runtime: float = 0.0


Measure = Callable[[CutCandidate], int]


def activation_bytes(search: BudgetSearch, candidate: CutCandidate) -> int:
    """The bytes the byte budget caps: ``sizes.saved_bytes`` (the one measure) of what the
    forward would save for the backward.

    Counted: every saved value the backward reads (``candidate.read``: extraction drops the
    rest), views of one activation as its base once, symbolic scalars at their size, and one
    RNG state per random op the backward recomputes (replayed on the forward's state, which
    is saved too). Graph inputs (parameters, buffers, the batch) and views of them cost
    nothing: that memory lives anyway. This equals the partition's ``saved_activation_bytes``
    of the forward it extracts (and its report's ``saved_bytes``).
    """
    del search  # the measure depends on the cut alone; kept for the Measure signature
    states = sum(rng_state_nbytes(device_of(n).type)
                 for n in candidate.recomputed if is_random(n))
    return saved_bytes(candidate.read) + states


def choose_candidate(candidates: Sequence[CutCandidate], cap: int, measure: Measure, *,
                     what: str = "activation memory budget", verb: str = "save",
                     runtime: Callable[[CutCandidate], float] | None = None,
                     lower_bound: Measure | None = None,
                     max_measured: int | None = None) -> CutCandidate:
    """The candidate to take under ``cap``: among those whose ``measure`` is at most ``cap``,
    the runtime-optimal cut (rank 0) when it fits, else the least runtime (``runtime(c)``,
    default ``c.runtime``), then the smaller measure, then the lower rank.

    The runtime-optimal cut comes first whatever its estimate: its bans are the heuristics'
    judgement of what is slow to recompute, which the runtime estimate does not see (the
    escalation cuts lift those bans at an estimated runtime of 0). The candidates and their
    order do not depend on the cap, so the rule is monotone by construction: if the answer
    under a higher cap still fits a lower one it stays the answer, and otherwise the new answer
    measures at most the lower cap, below the old one. When nothing fits,
    UnreachableMemoryBudgetError names the cap and the least reachable measure (``what`` and
    ``verb`` word it).

    Candidates are measured lazily, in the order of preference, until the first that fits (and
    its equals in runtime): a costly measure (the Inductor memory model lowers two graphs) is
    paid for few of them. ``lower_bound(c)`` (cheap; at most ``measure(c)``, or an estimate)
    skips a candidate it puts over the cap, and bounds the search for the least measure when
    none fits. ``max_measured`` bounds a costly search: after that many candidates measured in
    the order of preference without a fit, that many more are measured in the order of
    ``lower_bound`` (the likeliest to fit first) and the first that fits is taken; when none
    does, the error names the least of those measured.
    """
    runtime_of = runtime if runtime is not None else (lambda c: c.runtime)
    order = sorted(candidates, key=lambda c: (c.rank != 0, runtime_of(c), c.rank))
    measured: dict[int, int] = {}

    def measure_of(c: CutCandidate) -> int:
        if c.rank not in measured:
            measured[c.rank] = measure(c)
        return measured[c.rank]

    best: tuple[int, int, CutCandidate] | None = None
    best_key: tuple[bool, float] | None = None
    for c in order:
        key = (c.rank != 0, runtime_of(c))
        if best_key is not None and key != best_key:
            break
        if best is None and max_measured is not None and len(measured) >= max_measured:
            break
        if lower_bound is not None and lower_bound(c) > cap:
            continue
        m = measure_of(c)
        if m <= cap and (best is None or (m, c.rank) < best[:2]):
            best, best_key = (m, c.rank, c), key
    if best is not None:
        return best[2]
    if max_measured is not None:
        bound = lower_bound if lower_bound is not None else (lambda c: 0)
        rest = sorted((c for c in candidates if c.rank not in measured),
                      key=lambda c: (bound(c), c.rank))
        for c in rest[:max_measured]:
            if measure_of(c) <= cap:
                return c
        least = min((c for c in candidates if c.rank in measured),
                    key=lambda c: (measured[c.rank], c.rank))
        label = least.label
        if len(measured) < len(candidates):
            label += (f"; the least of the {len(measured)} of {len(candidates)} candidate cuts "
                      "priced, the others estimated higher")
        raise UnreachableMemoryBudgetError(what, cap, measured[least.rank], label, verb)
    least, amount = least_measure(candidates, measure_of, lower_bound)
    if amount <= cap:  # a candidate the bound skipped fits after all: the one found
        return least
    raise UnreachableMemoryBudgetError(what, cap, amount, least.label, verb)


def least_measure(candidates: Sequence[CutCandidate], measure: Measure,
                  lower_bound: Measure | None = None) -> tuple[CutCandidate, int]:
    """The candidate with the least ``measure`` (then the lower rank); with ``lower_bound``,
    candidates whose bound is above the least found so far are not measured."""
    bound = lower_bound if lower_bound is not None else (lambda c: 0)
    best: tuple[int, int, CutCandidate] | None = None
    for c in sorted(candidates, key=lambda c: (bound(c), c.rank)):
        if best is not None and bound(c) > best[0]:
            break
        m = measure(c)
        if best is None or (m, c.rank) < best[:2]:
            best = (m, c.rank, c)
    assert best is not None, "least_measure: no candidates"
    return best[2], best[0]


@dataclass(frozen=True)
class Cap:
    """One cap a candidate must meet: ``measure(candidate) <= limit``; ``what`` and ``verb``
    word the error when nothing does (see ``choose_candidate``)."""

    limit: int
    measure: Measure
    what: str = "activation memory budget"
    verb: str = "save"
    # How the fitting candidates are ordered when this cap chooses (default: their runtime).
    runtime: Callable[[CutCandidate], float] | None = None
    # A cheap lower bound of ``measure`` (see choose_candidate); None: none.
    lower_bound: Measure | None = None
    # How many candidates a costly measure may price in each phase (choose_candidate).
    max_measured: int | None = None


def byte_cap(search: BudgetSearch, limit: int) -> Cap:
    """The cap on saved activation bytes (``activation_bytes``)."""
    return Cap(validate_memory_budget_bytes(limit), functools.partial(activation_bytes, search))


def peak_cap(limit: int, peak: SimulatedPeak, *, after_byte_cap: bool = False,
             search: BudgetSearch | None = None) -> Cap:
    """The cap on the modelled peak; ``after_byte_cap``: it only sees the candidates within a
    byte cap, which its error then says. With ``search``, a candidate's inputs plus its saved
    activations (all alive when the forward returns) bound its peak from below."""
    verb = "peak at within the activation memory budget" if after_byte_cap else "peak at"
    # The simulation also estimates the whole step: a better order than the knapsack items'
    # runtime, which misses what a cut's recompute needs and what the forward no longer runs.
    runtime = peak.step_runtime if peak.estimator is not None else None
    bound = None
    if search is not None:
        def bound(c: CutCandidate) -> int:
            return max(peak.input_bytes + activation_bytes(search, c), peak.soft_bound(c.saved))
    # The Inductor model lowers two graphs per cut: its search is bounded.
    limit_measured = INDUCTOR_PRICINGS if peak.model == "inductor" else None
    return Cap(validate_peak_bytes(limit), peak, f"{peak.model_words} peak cap", verb, runtime,
               bound, limit_measured)


def _within(candidates: Sequence[CutCandidate], cap: Cap) -> list[CutCandidate]:
    """The candidates that fit ``cap``; UnreachableMemoryBudgetError when none does."""
    bound = cap.lower_bound
    fitting = [c for c in candidates
               if (bound is None or bound(c) <= cap.limit) and cap.measure(c) <= cap.limit]
    if not fitting:
        least, amount = least_measure(candidates, cap.measure, bound)
        raise UnreachableMemoryBudgetError(cap.what, cap.limit, amount, least.label, cap.verb)
    return fitting


def choose_under_caps(candidates: Sequence[CutCandidate], caps: Sequence[Cap]) -> CutCandidate:
    """``choose_candidate`` under several caps: every cap but the last filters the candidates
    (in order, so a cheap measure spares the costly ones), the last chooses among the rest.

    Still monotone in each cap: the candidates and their order are fixed, so lowering a cap
    only removes candidates, and an answer that still fits stays the answer.
    """
    remaining: Sequence[CutCandidate] = candidates
    for cap in caps[:-1]:
        remaining = _within(remaining, cap)
    last = caps[-1]
    return choose_candidate(remaining, last.limit, last.measure, what=last.what, verb=last.verb,
                            runtime=last.runtime, lower_bound=last.lower_bound,
                            max_measured=last.max_measured)


# ---- the candidate cuts of a search -----------------------------------------------------------

def candidate(search: BudgetSearch, saved: Sequence[fx.Node], label: str, rank: int
              ) -> CutCandidate:
    """``saved`` as a byte-budget candidate: what the backward reads and recomputes."""
    backward_inputs = [n for n in search.joint_graph.find_nodes(op="placeholder")
                       if is_tangent(n) or is_bwd_seed_offset(n)]
    live = backward_live_nodes(search.joint_graph, [*saved, *backward_inputs],
                               search.node_info.bw_outputs)
    kept = set(saved)
    recomputed = frozenset(n for n in live
                           if n in search.node_info.required_fw and n not in kept)
    return CutCandidate(label, rank, tuple(saved), tuple(n for n in saved if n in live),
                        recomputed)


def cut_candidates(search: BudgetSearch) -> list[CutCandidate]:
    """The byte budget's candidates, best first among equals (cached): the runtime-optimal
    cut, the cut at each fraction of ``BYTE_BUDGET_FRACTIONS`` (high to low), the reference
    estimator's cut at each fraction (``config.reference_estimator``, when it is not the
    search's) and the inputs alone; a cut found twice keeps its first place. None depends on
    a cap."""
    cached: list[CutCandidate] | None = search.cut_candidates_cache
    if cached is not None:
        return cached
    found: dict[frozenset[fx.Node], tuple[list[fx.Node], str]] = {}
    found[frozenset(search.runtime_optimal)] = (list(search.runtime_optimal), "runtime-optimal")
    for fraction in BYTE_BUDGET_FRACTIONS:
        saved = search.saved_values(fraction)[0]
        label = "recompute everything" if fraction == 0 else f"budget {fraction:g}"
        found.setdefault(frozenset(saved), (saved, label))
    # The reference estimator's cuts too (reference.py): a cap then also reaches what torch's
    # estimator would save at each fraction.
    reference = search.config.reference_estimator
    if reference is not None and reference != search.estimator and search.has_range:
        twin = search.with_estimator(reference)
        for fraction in BYTE_BUDGET_FRACTIONS[1:-1]:  # 1 and 0 do not depend on the estimator
            saved = twin.saved_values(fraction)[0]
            found.setdefault(frozenset(saved), (saved, f"budget {fraction:g} ({reference})"))
    inputs = list(search.node_info.inputs)
    found.setdefault(frozenset(inputs), (inputs, "inputs only"))
    made = [candidate(search, saved, label, rank)
            for rank, (saved, label) in enumerate(found.values())]
    baseline = made[0].recomputed
    # the knapsack items, whose recompute the runtime counts
    runtime_of = dict(zip(search.candidates, search.item_runtimes()))
    made = [
        replace(c, runtime=float(sum(runtime_of.get(n, 0.0)
                                     for n in c.recomputed - baseline)))
        for c in made]
    search.cut_candidates_cache = made
    return made


def within_bytes(search: BudgetSearch, cap: int, measure: Measure | None = None
                 ) -> CutCandidate:
    """The cut to take under a cap on ``measure`` (default ``activation_bytes``).

    The runtime-optimal cut comes first among all candidates, so when it fits no other
    cut is made: an ample cap costs nothing. See ``choose_candidate``.
    """
    cap = validate_memory_budget_bytes(cap)
    if measure is None:
        return within_caps(search, [byte_cap(search, cap)])
    return within_caps(search, [Cap(cap, measure)])


def within_caps(search: BudgetSearch, caps: Sequence[Cap]) -> CutCandidate:
    """The cut to take under every cap of ``caps`` (see ``choose_under_caps``).

    The runtime-optimal cut is measured first: when it fits every cap no other candidate
    is made or measured, so ample caps cost one measurement each.
    """
    if not caps:
        raise ValueError("within_caps: no cap given")
    top = candidate(search, search.runtime_optimal, "runtime-optimal", 0)
    if all(cap.measure(top) <= cap.limit for cap in caps):  # short-circuits: cheap first
        return top
    return choose_under_caps(cut_candidates(search), caps)


# ---- the cap on the simulated peak ------------------------------------------------------------

@dataclass
class CutGraphs:
    """The forward and backward graphs of one cut, as the partition builds them (no code)."""

    fw: fx.Graph
    bw: fx.Graph
    saved_values: list[fx.Node]
    saved_sym_nodes: list[fx.Node]
    replayed: list[str] = field(default_factory=list)  # random ops replaying the fw's RNG


def split_saved(chosen: Sequence[fx.Node]) -> tuple[list[fx.Node], list[fx.Node]]:
    """(saved symbolic scalars, saved values) of a chosen set, as the partition splits them."""
    return ([n for n in chosen if is_sym_node(n) and not is_assert_only_symbool(n)],
            [n for n in chosen if not is_sym_node(n)])


def extract_cut(joint_module: fx.GraphModule, chosen: Sequence[fx.Node], *,
                num_fwd_outputs: int,
                known_live: Mapping[frozenset[fx.Node], set[fx.Node]] | None = None,
                plan: CutPlan | None = None) -> CutGraphs:
    """Cut the joint at ``chosen`` (tensors and symbolic scalars): bare graphs, no passes.
    ``known_live`` and ``plan``: see ``extract_forward_backward_graphs``."""
    saved_sym_nodes, saved_values = split_saved(chosen)
    fw, bw, saved_values, saved_sym_nodes = extract_forward_backward_graphs(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs,
        known_live=known_live, plan=plan)
    return CutGraphs(fw, bw, saved_values, saved_sym_nodes)


def finish_cut(cut: CutGraphs) -> CutGraphs:
    """The passes the partition runs on a cut's graphs, in place: RNG replay, then the backward
    reordered like the autograd engine runs it. Returns ``cut``."""
    # Recompute must be a pure replay: every random op run again in the backward replays the
    # forward's RNG state, whatever made it recomputed.
    cut.replayed = replay_random_ops(cut.fw, cut.bw, len(cut.saved_sym_nodes))
    reorder_backward(cut.bw)
    return cut


@dataclass(frozen=True)
class CutMeasure:
    """What ``SimulatedPeak`` measured of one cut."""

    peak_bytes: int                          # the absolute modelled peak (inputs included)
    baseline_bytes: int                      # of which, forward inputs alive before the step
    recompute_runtime: float | None = None   # see recompute_estimate; None without estimator
    step_runtime: float | None = None        # see step_estimate; None without estimator
    model: str = "eager"                     # the memory model that priced it (memory_models)
    # Under dynamic shapes, the absolute peak at every shape is the largest of these
    # (symbolic_peak.py); empty when static.
    peak_expressions: tuple[Any, ...] = ()


class NodeEstimates:
    """``estimate_runtime`` of the nodes of one joint's cuts, remembered by node name.

    Extraction copies a joint node under its name, with its target and its ``meta`` (the same
    ``val`` object), so a copy's estimate is the original's: the cuts of one search share most
    nodes, and each is estimated once per partition instead of once per cut. A name whose
    target or value differs (a node extraction made) is estimated again. The joint's own
    nodes, which a cut's plan lists, are found by identity first.
    """

    def __init__(self, estimator: str | None = None) -> None:
        self.estimator = estimator
        self._by_name: dict[str, tuple[Any, Any, float]] = {}
        self._signatures: SignatureMemo = {}
        self._by_node: dict[fx.Node, tuple[Any, Any, float]] = {}

    def __call__(self, node: fx.Node) -> float:
        val = node.meta.get("val")
        # The same node (a joint node of a cut's plan) first, then its name (a copy).
        found = self._by_node.get(node) or self._by_name.get(node.name)
        if found is not None and found[0] is node.target and found[1] is val:
            return found[2]
        estimate = estimate_runtime(node, self.estimator, signatures=self._signatures)
        self._by_name[node.name] = self._by_node[node] = (node.target, val, estimate)
        return estimate


def recompute_estimate(fw: fx.Graph | Sequence[fx.Node], bw: fx.Graph | Sequence[fx.Node],
                       estimator: str | None = None, estimates: NodeEstimates | None = None) -> float:
    """The estimated runtime the backward spends recomputing: the estimates (``estimator``) of
    the forward nodes that appear again in the backward (same name; extraction, torch's too,
    keeps the joint's names). A formula that scores any partitioner's graphs alike.
    ``estimates``: a memo of the same estimator shared by the cuts of one joint."""
    estimate = estimates if estimates is not None else NodeEstimates(estimator)
    forward = {n.name for n in _nodes_of(fw) if n.op == "call_function"}
    return float(sum(estimate(n) for n in _nodes_of(bw)
                     if n.op == "call_function" and n.name in forward))


def step_estimate(fw: fx.Graph | Sequence[fx.Node], bw: fx.Graph | Sequence[fx.Node],
                  estimator: str | None = None, estimates: NodeEstimates | None = None) -> float:
    """The estimated runtime of one forward+backward step: the estimates (``estimator``) of
    every call in both graphs, before the RNG replay (a replayed random op counts as itself).
    ``estimates``: a memo of the same estimator shared by the cuts of one joint."""
    estimate = estimates if estimates is not None else NodeEstimates(estimator)
    return float(sum(estimate(n) for graph in (fw, bw) for n in _nodes_of(graph)
                     if n.op == "call_function"))


def _nodes_of(graph: fx.Graph | Sequence[fx.Node]) -> Iterable[fx.Node]:
    """A graph's nodes, or a plan's list of them (extract.CutPlan: the joint nodes the
    graph's copies would be; a copy's estimate is its original's, see NodeEstimates)."""
    return graph.nodes if isinstance(graph, fx.Graph) else graph


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
    included. ``model`` says how the step is modelled (fx/memory_models.py): ``"eager"``
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
        blocks, as ``max_memory_allocated`` counts them (fx/caching_allocator.py)."""
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
        from ..fx.memory import simulate_partition, simulate_plan, split_op_workspace

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
        from ..fx.memory_models import price_partition

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
