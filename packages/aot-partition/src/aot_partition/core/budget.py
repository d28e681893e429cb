"""Memory budgets on plain data: the cut to take under a fraction, a byte cap or a peak cap.

The search, runtime-aware:

1. The runtime-optimal cut recomputes nothing that has a ``runtime``: every forward node with
   ``runtime > 0`` that may be banned is banned ("recomputing it costs runtime r"), on top of
   the graph's own bans and the call's ``bans``. Without runtimes it is the plain min cut.
2. The knapsack items are the bans a budget may lift: the node's own, the call's and the
   runtime ones, of nodes that reach the backward and can be saved. Category bans (inputs,
   seeds, effectful and random ops) are never lifted. An item weighs its bytes and is worth
   its runtime: the knapsack keeps the costly recomputes saved and releases the cheap ones.
3. The candidate cuts, fixed for a graph and its options: the runtime-optimal cut, the cut
   whose released items are the knapsack's answer at each fraction i/32, and the cut with
   every item released ("recompute everything"); that cut again with the save costs the byte
   measure counts (inputs, parameters and seeds free, no bias), when it saves fewer bytes
   ("recompute everything, fewest bytes": the min cut's save costs weigh an input far from the
   backward above an intermediate near it); and, priced the same way, the cut that keeps the
   ``compute`` nodes banned (runtime or not) and releases every other item ("compute saved, the
   rest recomputed": jax's ``dots_saveable``, whose cut is one of this network's, so under its
   bytes the answer recomputes no more, wherever the core may make that cut at all). Each is
   measured once: its saved bytes (inputs, parameters and seeds free: they live anyway), its
   recompute runtime (the summed ``runtime`` of what the backward recomputes) and, under a peak
   cap, its simulated peak (timeline.py).
4. A budget chooses among the cuts that fit it: the runtime-optimal cut when it fits, else
   the least recompute runtime, then the fewer bytes, then the earlier candidate. A fraction
   ``f`` allows ``least + f * (optimal - least)`` saved bytes, ``least`` being the fewer of
   the two recompute-everything cuts' and ``optimal`` the runtime-optimal cut's; at 1.0 the
   answer is the runtime-optimal cut. A cap nothing meets raises UnreachableMemoryBudgetError
   naming the least reachable candidate.
   ``fraction_of`` names what a fraction is a fraction of (``FRACTION_OF``): "span" (the
   default, as above) or "runtime_optimal", torch's meaning (``activation_memory_budget``, the
   fx path's): ``f * optimal`` saved bytes, 0.0 being the inputs-only cut (0 bytes in the one
   measure). A "runtime_optimal" limit below every candidate is answered with the least
   candidate (the fewest bytes, then the least recompute), as torch's search answers 0.0 with
   its recompute-everything cut: a fraction never raises. Only the limit differs; the
   candidates, refinement and choice are the same.
5. Refinement, the search's resolution. The knapsack weighs items' bytes, not the cut's, so a
   candidate may save much less than its fraction allows (or overshoot it). A limit is refined
   when the best cut meeting it measures at most a floor below it and a fixed candidate with
   less recompute misses it: from the nearest such candidate (the fewest bytes above the
   limit), (a) the knapsack over what it keeps saved, re-solved to free just enough bytes (the
   bytes to free bisected, at most REPAIR_TRIES cuts), then, if no cut above the floor came of
   it, (b) what it keeps saved released one item at a time, least runtime per byte first,
   bisected to a single item: the smallest count whose cut meets the limit. Every cut tried
   that meets the limit is a choice. The floor of fraction i/32 (1 <= i <= 31) is the limit of
   (i-1)/32: **every fraction i/32 gets a cut saving more than (i-1)/32 may, a cut of its own,
   unless the refinement finds none**: (b) then showed that, along its order, keeping one item
   more saved misses the limit while releasing it drops below the floor. The floor of any
   other budget (a cap, a fraction off the 1/32 grid) is 1/1024 of the candidates' range below
   its limit (REFINE_STEPS). Only byte caps (and the 1/32 fractions) refine at their own limit;
   see step 6 for the other budgets.
6. Monotone and deterministic. A byte budget (a fraction in either meaning, or a cap) chooses
   among the fixed candidates, the refined answer of every fraction i/32 whose limit it meets,
   and every cut the refinements of those fractions and of the next one above tried that fits
   (the pool: a fixed function of the graph and options, cached). A larger limit meets
   everything a smaller one does, so it never answers with more recompute runtime: fractions
   are monotone by construction. A byte cap also refines at its own limit (step 5), which can
   only do better than its pool; so a larger cap never recomputes more than a smaller cap's
   pool answer, but a smaller cap's own refinement may find a cut the larger one's does not
   (byte caps are monotone up to that refinement). A peak cap chooses among the fixed
   candidates and one pool of PEAK_STEPS cuts, the same for every cap: the runtime-optimal cut
   with k/PEAK_STEPS of its items released, least runtime per byte first (no per-cap
   refinement): monotone by construction. The cuts tried are memoized, but an answer never
   depends on the calls made before.

What a search costs. Every cut is a min cut of the same network under other bans, solved
through ``cut_family.CutFamily``: on the network contracted between the closest solved cuts
whose bans are a subset and a superset of the new ones (nested bans give nested cuts), or not
at all when an earlier whole-network flow stays maximal under the new bans; the answer is the
one a fresh min cut gives. A fraction i/32 or a byte budget makes at most 35 fixed cuts, then
for each 1/32 limit up to the next one above it at most REPAIR_TRIES + log2(items) refinement
cuts, and only where no fixed candidate lands between the limit and the one below (a 1/32
fraction's refinements also serve every other budget: one search per graph and options). A
peak cap makes the fixed cuts and PEAK_STEPS nested ones, and simulates each (timeline.py: a
pass over the graph per cut). The number of cuts does not depend on the graph's size; each costs
a max-flow on what is left open plus a few passes over the network's arrays
(benchmarks/RESULTS-core-budget.md has the 50,000-node shapes).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UnreachableMemoryBudgetError
from .graph import (
    CATEGORY_BANS,
    CoreGraph,
    CoreGraphError,
    CoreNode,
    CorePartition,
    ban_reasons,
    check_has_backward,
    check_release,
    default_save_costs,
    distances_from_backward,
    partition_banned,
)
from .knapsack import KNAPSACK_SOLVERS, get_knapsack_solver
from .report import CoreReport, core_report
from .rules import MAX_DIST_FROM_BW
from .timeline import CoreMemoryTimeline, recomputed_mask, simulate_memory

log = logging.getLogger(__name__)

__all__ = ["BUDGET_FRACTIONS", "FRACTION_OF", "BudgetedPartition", "CoreBudget",
           "partition_under_budget"]

# The fractions whose knapsack cuts are candidates (1, 31/32, ..., 0), as budget/candidates.py has.
GRID = 32
BUDGET_FRACTIONS = tuple(i / GRID for i in range(GRID, -1, -1))
# What a fraction is a fraction of (``partition_under_budget``'s ``fraction_of``): "span", the
# range from the recompute-everything cut's saved bytes (0.0) to the runtime-optimal cut's
# (1.0); "runtime_optimal", torch's meaning: the runtime-optimal cut's saved bytes, 0.0 being
# the inputs-only cut.
FRACTION_OF = ("span", "runtime_optimal")
# A refinement stops within 1/REFINE_STEPS of the measure's range below its limit.
REFINE_STEPS = 1024
REPAIR_TRIES = 8
# A peak cap's pool: the runtime-optimal cut with 1/PEAK_STEPS, 2/PEAK_STEPS, ... of its items
# released (least runtime per byte first).
PEAK_STEPS = 16
_PROBE_RANK = 1 << 30  # after every fixed candidate; ties among probes: by released items
RUNTIME_BAN = "recomputing it costs runtime {runtime:g}"
# The label of the recompute-everything cut priced by the byte measure (the fewest bytes).
FEWEST_BYTES = "recompute everything, fewest bytes"
# The label of the cut that keeps the compute nodes saved (jax's dots_saveable).
COMPUTE_SAVED = "compute saved, the rest recomputed"
COMPUTE_BAN = "a compute node: saved as jax's dots_saveable saves it"
# UnreachableMemoryBudgetError's wording, per budget kind (budget/caps.py's words).
_UNREACHABLE_WORDS = {"saved_bytes": ("activation memory budget", "save"),
                      "peak_bytes": ("simulated memory peak cap", "peak at")}


@dataclass(frozen=True)
class CoreBudget:
    """The budget a partition was given: ``kind`` is fraction, saved_bytes or peak_bytes;
    ``fraction_of`` what a fraction is a fraction of (``FRACTION_OF``)."""

    kind: str
    value: float
    fraction_of: str = "span"

    def describe(self) -> str:
        if self.kind == "fraction" and self.fraction_of == "runtime_optimal":
            return f"memory budget {self.value:g} (fraction of the runtime-optimal cut's " \
                   "saved bytes, torch's meaning)"
        if self.kind == "fraction":
            return f"memory budget {self.value:g} (fraction between recompute-everything and " \
                   "runtime-optimal saved bytes)"
        if self.kind == "saved_bytes":
            return f"saved-bytes cap {int(self.value)} bytes"
        return f"simulated peak cap {int(self.value)} bytes"


@dataclass(frozen=True)
class _Candidate:
    label: str
    rank: int
    result: CorePartition
    released: tuple[str, ...]       # ids whose ban the budget lifted
    saved_bytes: int
    recompute_runtime: float
    path: tuple[int, ...] = ()       # a refinement's probe: its released items' positions
    _peak: list[CoreMemoryTimeline] = field(default_factory=list, compare=False, repr=False)

    @property
    def timeline(self) -> CoreMemoryTimeline:
        if not self._peak:
            self._peak.append(simulate_memory(self.result))
        return self._peak[0]

    def measure(self, kind: str) -> int:
        return self.saved_bytes if kind == "saved_bytes" else self.timeline.peak_bytes


@dataclass(frozen=True)
class BudgetedPartition:
    """The answer under a budget: the cut (``partition``), the budget given, what it saves and
    recomputes, and which candidate it is (``label``)."""

    partition: CorePartition
    budget: CoreBudget
    label: str
    released: dict[str, str]         # id -> the ban the budget lifted, in graph order
    saved_bytes: int                 # the one measure: inputs, parameters and seeds free
    recompute_runtime: float
    _candidate: _Candidate = field(repr=False, compare=False)

    @property
    def saved(self) -> tuple[str, ...]:
        return self.partition.saved

    @property
    def timeline(self) -> CoreMemoryTimeline:
        return self._candidate.timeline

    @property
    def peak_bytes(self) -> int:
        return self.timeline.peak_bytes

    def report(self) -> CoreReport:
        """The per-node report in core terms."""
        return core_report(self.partition, budget=self.budget.describe(), chosen=self.label,
                           saved_bytes=self.saved_bytes, peak_bytes=self.peak_bytes,
                           recompute_runtime=self.recompute_runtime, released=self.released)


def _budget(fraction: float | None, max_saved_bytes: int | None,
            max_peak_bytes: int | None, fraction_of: str = "span") -> CoreBudget:
    if fraction_of not in FRACTION_OF:
        raise CoreGraphError(f"fraction_of must be one of {', '.join(FRACTION_OF)}; got "
                             f"{fraction_of!r}")
    if fraction_of != "span" and fraction is None:
        raise CoreGraphError(f"fraction_of={fraction_of!r} applies to a fraction budget; give "
                             "fraction=")
    given = [(kind, value) for kind, value in (("fraction", fraction),
                                               ("saved_bytes", max_saved_bytes),
                                               ("peak_bytes", max_peak_bytes))
             if value is not None]
    if len(given) != 1:
        raise CoreGraphError("give exactly one budget: fraction (0 to 1), max_saved_bytes or "
                             f"max_peak_bytes; got {', '.join(k for k, _ in given) or 'none'}")
    kind, value = given[0]
    if kind == "fraction":
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0 <= value <= 1):
            raise CoreGraphError(f"fraction must be a number between 0 and 1 (0 = recompute "
                                 f"everything, 1 = runtime-optimal); got {value!r}")
        return CoreBudget(kind, float(value), fraction_of)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        name = "max_saved_bytes" if kind == "saved_bytes" else "max_peak_bytes"
        raise CoreGraphError(f"{name} must be an int >= 0 (bytes); got {value!r}")
    return CoreBudget(kind, int(value))


class _Search:
    """The candidates of one graph under one set of options (built on first need)."""

    def __init__(self, graph: CoreGraph, bans: Mapping[str, str], release: Collection[str],
                 knapsack: str, options: dict[str, Any]) -> None:
        self.graph, self.release, self.knapsack, self.options = graph, list(release), knapsack, \
            options
        self._base_bans: dict[int, str] | None = None
        self._base_ban_order = np.zeros(0, dtype=np.int64)
        self._base_ban_whys: list[str] = []
        self._families: dict[bool, Any] = {}
        self.runtimes = np.array([node.runtime for node in graph.nodes], dtype=np.float64)
        costs = default_save_costs(graph, recompute_views=options["recompute_views"],
                                   parameters_are_free=options["parameters_are_free"])
        bannable = graph.structure.bannable
        released = set(self.release)
        self.bans = dict(bans)
        for i, node in enumerate(graph.nodes):
            if (node.runtime > 0 and node.forward and bannable[i] and math.isfinite(costs[i])
                    and node.id not in released and node.id not in self.bans
                    and not _never_released(node)):
                self.bans[node.id] = RUNTIME_BAN.format(runtime=node.runtime)
        self.optimal = self._candidate("runtime-optimal", 0, ())
        dist = distances_from_backward(graph)
        index = graph.index
        self.items = [name for name in self.optimal.result.banned
                      if not _never_released(graph.nodes[index[name]])
                      and dist[index[name]] < int(1e9) and math.isfinite(costs[index[name]])]
        self._position = {name: k for k, name in enumerate(self.items)}
        self._all: list[_Candidate] | None = None
        self._least = self.optimal  # the recompute-everything end, set by candidates()
        # Cuts by released set: the fixed candidates and every refinement's probes.
        self._cuts: dict[tuple[str, ...], _Candidate] = {(): self.optimal}
        self._grid: dict[int, _Candidate] = {}     # i -> the refined answer at fraction i/32
        self._grid_tried: dict[int, list[_Candidate]] = {}  # i -> the cuts its refinement tried
        self._tried: list[_Candidate] | None = None
        self._peak_pool: list[_Candidate] | None = None
        self._orders: dict[tuple[str, ...], list[str]] = {}  # a miss's release order
        self._per_byte_order: list[str] | None = None
        self._tolerances: dict[str, float] = {}

    def _candidate(self, label: str, rank: int, released: tuple[str, ...],
                   path: tuple[int, ...] = (), priced_by_bytes: bool = False,
                   also_banned: Mapping[int, str] | None = None) -> _Candidate:
        if self.options["rules"]:  # graph-wide rules re-read which nodes are banned
            banned = ban_reasons(self.graph, bans=self.bans, release=[*self.release, *released],
                                 rules=self.options["rules"],
                                 max_dist_from_bw=self.options["max_dist_from_bw"])
        else:  # the runtime-optimal cut's bans less the released nodes: no re-resolving
            if self._base_bans is None:
                self._base_bans = ban_reasons(self.graph, bans=self.bans, release=self.release)
                self._base_ban_order = np.fromiter(self._base_bans, dtype=np.int64,
                                                   count=len(self._base_bans))
                self._base_ban_whys = list(self._base_bans.values())
            kept = np.ones(len(self.graph.nodes), dtype=bool)
            index = self.graph.index
            kept[np.fromiter(map(index.__getitem__, released), dtype=np.int64,
                             count=len(released))] = False
            keep = kept[self._base_ban_order]
            whys = self._base_ban_whys
            banned = dict(zip(self._base_ban_order[keep].tolist(),
                              [whys[k] for k in np.flatnonzero(keep).tolist()]))
        if also_banned:
            banned = dict(sorted({**also_banned, **banned}.items()))
        result = self._cut(banned, priced_by_bytes)
        runtime = float(self.runtimes[recomputed_mask(result)].sum())
        return _Candidate(label, rank, result, released, _saved_bytes(result, self.options),
                          runtime, path)

    def _cut(self, banned: dict[int, str], priced_by_bytes: bool) -> CorePartition:
        """``partition_banned`` with this search's options; with the scipy solver through a
        CutFamily per pricing (cut_family.py: the same cut, solved on what earlier cuts leave
        open, or reused)."""
        family = self._families.get(priced_by_bytes)
        if family is None and self.options["solver"] == "scipy":
            try:
                from .cut_family import CutFamily
            except ModuleNotFoundError:  # no scipy: the solver falls back by itself
                pass
            else:
                family = self._families[priced_by_bytes] = CutFamily(
                    self.graph, recompute_views=self.options["recompute_views"],
                    parameters_are_free=self.options["parameters_are_free"],
                    priced_by_bytes=priced_by_bytes)
        if family is not None:
            return family.cut(banned)
        return partition_banned(self.graph, banned, solver=self.options["solver"],
                                recompute_views=self.options["recompute_views"],
                                parameters_are_free=self.options["parameters_are_free"],
                                priced_by_bytes=priced_by_bytes)

    def candidates(self) -> list[_Candidate]:
        """Every fixed candidate, the runtime-optimal first (see the module doc)."""
        if self._all is not None:
            return self._all
        graph, index = self.graph, self.graph.index
        if not self.items:  # nothing a budget may release: one cut, and its fewest bytes
            fewest = self._fewest_bytes(self.optimal, 1)
            self._least = fewest[0] if fewest else self.optimal
            self._all = [self.optimal, *fewest, *self._compute_saved(1 + len(fewest))]
            return self._all
        everything = self._candidate("recompute everything", 1, tuple(self.items))
        found = {(): self.optimal, tuple(self.items): everything}
        fewest = self._fewest_bytes(everything, 2)
        self._least = fewest[0] if fewest else everything
        span = self.optimal.saved_bytes - self._least.saved_bytes
        if span > 0 and self.items:
            memories = [graph.nodes[index[name]].nbytes / span for name in self.items]
            runtimes = [graph.nodes[index[name]].runtime for name in self.items]
            solve = _grouped(get_knapsack_solver(self.knapsack), memories, runtimes)
            for fraction in BUDGET_FRACTIONS[1:-1]:
                recompute = solve(fraction)
                released = tuple(self.items[k] for k in recompute)
                if released not in found:
                    found[released] = self._candidate(f"budget {fraction:g}",
                                                      len(found) + len(fewest), released)
        compute_saved = self._compute_saved(len(found) + len(fewest))
        ordered = sorted([*found.values(), *fewest, *compute_saved], key=lambda c: c.rank)
        self._all = ordered
        self._cuts.update(found)
        log.debug("core budget: %d candidate cuts over %d knapsack items", len(ordered),
                  len(self.items))
        return ordered

    def _fewest_bytes(self, everything: _Candidate, rank: int) -> list[_Candidate]:
        """The cut releasing what ``everything`` releases, priced by the byte measure, when
        it saves fewer bytes: the min cut's save costs weigh an input far from the backward
        above an intermediate near it (and an input is free to keep), so the
        recompute-everything cut may save that intermediate though the inputs would do."""
        cut = self._candidate(FEWEST_BYTES, rank, everything.released, priced_by_bytes=True)
        return [cut] if cut.saved_bytes < everything.saved_bytes else []

    def _compute_saved(self, rank: int) -> list[_Candidate]:
        """jax's ``dots_saveable`` in core terms: the ``compute`` nodes stay banned, every
        other item is released, priced by the byte measure (none when there is no compute node
        to keep: that is the fewest-bytes everything cut). Any policy that saves the compute
        nodes the backward reads and recomputes the rest is a cut of this network, so this cut
        saves no more bytes than it does, and it recomputes only what such a policy recomputes
        (its bans stop at the same compute nodes)."""
        index, nodes = self.graph.index, self.graph.nodes
        released = tuple(name for name in self.items if nodes[index[name]].category != "compute")
        # A compute node without a runtime is no item: banned here too, or the cut could
        # recompute it and, through it, what the policy does not.
        costs = default_save_costs(self.graph, recompute_views=self.options["recompute_views"],
                                   parameters_are_free=self.options["parameters_are_free"])
        bannable, kept = self.graph.structure.bannable, set(self.release)
        free_compute = {i: COMPUTE_BAN for i, node in enumerate(nodes)
                        if node.category == "compute" and node.forward and node.runtime == 0
                        and bannable[i] and math.isfinite(costs[i]) and node.id not in kept}
        if len(released) == len(self.items) and not free_compute:
            return []  # no compute node to keep: the fewest-bytes everything cut
        return [self._candidate(COMPUTE_SAVED, rank, released, priced_by_bytes=True,
                                also_banned=free_compute)]

    def least_and_most(self) -> tuple[int, int]:
        """(the least saved bytes: recomputing everything, runtime-optimal saved bytes)."""
        self.candidates()
        return self._least.saved_bytes, self.optimal.saved_bytes

    def fraction_limit(self, fraction: float, fraction_of: str = "span") -> float:
        """The saved bytes ``fraction`` allows (``FRACTION_OF``)."""
        if fraction_of == "runtime_optimal":
            return fraction * self.optimal.saved_bytes
        least, most = self.least_and_most()
        return least + fraction * (most - least)

    def tolerance(self, kind: str) -> float:
        """How close to its limit a refined cut must come: 1/1024 of the candidates' range
        of the measure (saved bytes: recompute-everything to runtime-optimal)."""
        if kind not in self._tolerances:
            measures = [c.measure(kind) for c in self.candidates()]
            self._tolerances[kind] = (max(measures) - min(measures)) / REFINE_STEPS
        return self._tolerances[kind]

    def grid_answer(self, i: int) -> _Candidate:
        """The refined answer at fraction i/32 (1 <= i <= 31), from the fixed candidates and
        the refined answers below it, refined above the limit of (i-1)/32 (module doc, step
        5): a fixed function of the graph and options."""
        found = self._grid.get(i)
        if found is None:
            limit = self.fraction_limit(BUDGET_FRACTIONS[GRID - i])
            start = [c for c in self.candidates() if c.saved_bytes <= limit]
            start += [self.grid_answer(j) for j in range(1, i)]
            floor = self.fraction_limit(BUDGET_FRACTIONS[GRID - i + 1])
            tried: list[_Candidate] = []
            self._tried = tried
            try:
                found = self._grid[i] = _best(self.refine(limit, "saved_bytes", start, floor))
            finally:
                self._tried = None
            self._grid_tried[i] = tried
        return found

    def grid_probes(self, i: int) -> list[_Candidate]:
        """Every cut the refinement of fraction i/32 tried, meeting its limit or not (module
        doc, step 6): what a byte budget at or below that limit also chooses among."""
        self.grid_answer(i)
        return self._grid_tried[i]

    def peak_pool(self) -> list[_Candidate]:
        """The cuts a peak cap chooses among besides the fixed candidates, the same for every
        cap (so a larger cap never answers worse): from the runtime-optimal cut, its items
        released one at a time, least runtime per byte first, cut after each 1/PEAK_STEPS of
        them (nested ban sets: the cut family solves each on what the last one left open)."""
        if self._peak_pool is None:
            order = self._release_order(set())
            counts = sorted({max(1, round(k * len(order) / PEAK_STEPS))
                             for k in range(1, PEAK_STEPS + 1)}) if order else []
            self._peak_pool = [self._probe(set(order[:m])) for m in counts]
        return self._peak_pool

    def refine(self, limit: float, kind: str, fitting: list[_Candidate],
               floor: float | None = None, repair: bool = True) -> list[_Candidate]:
        """``fitting`` (candidates that meet ``limit``, at least one) and the cuts refining
        finds when the best of them measures ``floor`` or less (default: 1/1024 of the
        candidates' range below ``limit``) and a candidate with less recompute misses the
        limit (see the module doc, step 5)."""
        if floor is None:
            floor = limit - self.tolerance(kind)
        best = _best(fitting, kind)
        if best.measure(kind) > floor:
            return fitting
        better = [c for c in self.candidates()
                  if c.measure(kind) > limit and c.recompute_runtime < best.recompute_runtime]
        if not better:
            return fitting
        miss = min(better, key=lambda c: (c.measure(kind), c.recompute_runtime, c.rank))
        found = fitting + (self._repair(miss, limit, kind, floor) if repair else [])
        if _best(found, kind).measure(kind) <= floor:
            found += self._one_by_one(miss, limit, kind, floor)
        return found

    def _probe(self, released: set[str]) -> _Candidate:
        key = tuple(sorted(released, key=self._position.__getitem__))
        candidate = self._cuts.get(key)
        if candidate is None:
            # The label names the cut only (a probe is shared by every refinement reaching it)
            candidate = self._cuts[key] = self._candidate(
                f"refined: {len(key)} of {len(self.items)} items released", _PROBE_RANK, key,
                tuple(self._position[n] for n in key))
        if self._tried is not None:
            self._tried.append(candidate)
        return candidate

    def _release_order(self, released: set[str]) -> list[str]:
        """The items not in ``released``, least runtime per byte first, then graph order."""
        if self._per_byte_order is None:
            index, nodes = self.graph.index, self.graph.nodes
            self._per_byte_order = sorted(
                self.items, key=lambda name: (_per_byte(nodes[index[name]]),
                                              self._position[name]))
        return [name for name in self._per_byte_order if name not in released]

    def _one_by_one(self, miss: _Candidate, limit: float, kind: str,
                    floor: float) -> list[_Candidate]:
        """From ``miss`` on, release what it keeps saved one item at a time, least runtime
        per byte first: bisect the smallest count whose cut meets ``limit`` (stopping early
        at one above ``floor``); the probes that meet it."""
        released = set(miss.released)
        order = self._orders.get(miss.released)
        if order is None:
            order = self._orders[miss.released] = self._release_order(released)
        found: list[_Candidate] = []
        good, bad = len(order), 0  # releasing order[:good] meets the limit (everything does)
        while good - bad > 1:
            middle = (good + bad) // 2
            candidate = self._probe({*released, *order[:middle]})
            if candidate.measure(kind) <= limit:
                found.append(candidate)
                good = middle
                if candidate.measure(kind) > floor:
                    break
            else:
                bad = middle
        return found

    def _repair(self, miss: _Candidate, limit: float, kind: str,
                floor: float) -> list[_Candidate]:
        """From ``miss`` on, the knapsack over what it keeps saved with the capacity less its
        overshoot: the least runtime released to free that many bytes; if the cut still
        overshoots, the overshoot grows by what is left, up to REPAIR_TRIES times."""
        index, nodes = self.graph.index, self.graph.nodes
        released = set(miss.released)
        kept = [name for name in self.items if name not in released]
        weights = [nodes[index[name]].nbytes for name in kept]
        total = sum(weights)
        if not total:
            return []
        solve = _grouped(get_knapsack_solver(self.knapsack), [w / total for w in weights],
                         [nodes[index[name]].runtime for name in kept])
        # Bisect the bytes to free (the cut's bytes fall by more or less than the items'):
        # ``low`` frees too little, ``high`` enough; start at the overshoot, double until
        # enough, then halve the interval, REPAIR_TRIES probes at most.
        low, high = 0.0, math.inf
        free = miss.measure(kind) - limit
        found: list[_Candidate] = []
        for _ in range(REPAIR_TRIES):
            if free > total or high - low <= 1:
                break
            released = {*miss.released, *(kept[k] for k in solve((total - free) / total))}
            candidate = self._probe(released)
            if candidate.measure(kind) <= limit:
                found.append(candidate)
                high = free
                if candidate.measure(kind) > floor:
                    break
            else:
                low = free
            free = 2 * free if math.isinf(high) else (low + high) / 2
        return found

def _grouped(solve: Any, memories: list[float], runtimes: list[float]) -> Any:
    """``fraction -> released item positions``: the knapsack over ``memories`` / ``runtimes``
    with identical items (the same bytes and runtime: a repeated layer's nodes) solved as one
    bounded item each, split in binary parts (1, 2, 4, ..., the rest: every count in between is
    reachable), so a 32-layer model's knapsack is a 32nd of the size. A group's released count
    goes to its first items in graph order, the same ones at every fraction that releases as
    many. Without repeats the knapsack is solved as given."""
    groups: dict[tuple[float, float], list[int]] = {}
    for k, key in enumerate(zip(memories, runtimes)):
        groups.setdefault(key, []).append(k)
    if len(groups) == len(memories):
        return lambda fraction: solve(memories, runtimes, fraction)[2]
    parts: list[tuple[tuple[float, float], int]] = []
    for key, members in groups.items():
        count, size = len(members), 1
        while count > 0:
            take = min(size, count)
            parts.append((key, take))
            count -= take
            size *= 2
    part_memories = [key[0] * take for key, take in parts]
    part_runtimes = [key[1] * take for key, take in parts]

    def released(fraction: float) -> list[int]:
        counts: dict[tuple[float, float], int] = {}
        for p in solve(part_memories, part_runtimes, fraction)[2]:
            key, take = parts[p]
            counts[key] = counts.get(key, 0) + take
        return sorted(k for key, n in counts.items() for k in groups[key][:n])

    return released


def _never_released(node: CoreNode) -> bool:
    """A category ban no budget lifts: inputs, seeds, effectful and random ops."""
    return node.forward and node.category in CATEGORY_BANS and not node.allow_recompute


def _saved_bytes(result: CorePartition, options: Mapping[str, Any]) -> int:
    del options  # one measure whatever the cut's costs: CorePartition.saved_bytes
    return result.saved_bytes


def _search(graph: CoreGraph, bans: Mapping[str, str], release: Collection[str],
            knapsack: str, options: dict[str, Any]) -> _Search:
    """The search for these options, cached on the graph: a sweep builds its cuts once."""
    key = ("core-budget", tuple(sorted(bans.items())), tuple(release), knapsack,
           tuple(sorted(options.items())))
    found = graph._cache.get(key)
    if found is None:
        found = graph._cache[key] = _Search(graph, bans, release, knapsack, options)
    return found


def _best(candidates: list[_Candidate], kind: str = "saved_bytes") -> _Candidate:
    """The least recompute runtime, then the smaller measure, then the earlier candidate
    (a fixed one's rank; probes by their released items)."""
    return min(candidates, key=lambda c: (c.rank != 0, c.recompute_runtime, c.measure(kind),
                                          c.rank, c.path))


def _per_byte(node: CoreNode) -> float:
    """Recompute runtime per byte freed: the order a refinement releases items in."""
    return node.runtime / node.nbytes if node.nbytes else math.inf


def _choose(search: _Search, budget: CoreBudget) -> _Candidate:
    optimal = search.optimal
    if budget.kind == "fraction":
        if budget.value == 1:
            return optimal
        least, most = search.least_and_most()
        if most <= least and budget.fraction_of == "span":
            return optimal
        limit: float = search.fraction_limit(budget.value, budget.fraction_of)
        kind = "saved_bytes"
    else:
        limit, kind = budget.value, budget.kind
        if optimal.measure(kind) <= limit:  # an ample cap makes no other cut
            return optimal
    measured = [(c, c.measure(kind)) for c in search.candidates()]
    if kind == "peak_bytes":  # one pool for every cap: monotone
        measured += [(c, c.measure(kind)) for c in search.peak_pool()]
    fitting = [c for c, m in measured if m <= limit]
    if not fitting and budget.kind == "fraction":  # torch's meaning, below every cut
        fewest = min(m for _, m in measured)
        return _best([c for c, m in measured if m == fewest])
    if not fitting:
        least_candidate, amount = min(measured, key=lambda cm: (cm[1], cm[0].rank, cm[0].path))
        what, verb = _UNREACHABLE_WORDS[kind]
        raise UnreachableMemoryBudgetError(what, int(limit), amount, least_candidate.label, verb)
    if kind == "saved_bytes":
        # Every refined 1/32 answer the limit meets, and every cut the refinements up to the
        # next 1/32 limit tried that fits: a larger limit chooses among more (module doc,
        # step 6).
        grid = [i for i in range(1, GRID) if search.fraction_limit(i / GRID) <= limit]
        fitting += [search.grid_answer(i) for i in grid]
        for i in range(1, min(len(grid) + 1, GRID - 1) + 1):
            fitting += [c for c in search.grid_probes(i) if c.saved_bytes <= limit]
        if budget.kind == "saved_bytes":  # a byte cap: refined at its own limit too
            return _best(search.refine(limit, kind, fitting), kind)
    return _best(fitting, kind)


def partition_under_budget(graph: CoreGraph | Iterable[CoreNode], *, fraction: float | None = None,
                           max_saved_bytes: int | None = None,
                           max_peak_bytes: int | None = None, knapsack: str = "dp",
                           bans: Mapping[str, str] | None = None,
                           release: Collection[str] = (), solver: str = "scipy",
                           recompute_views: bool = False,
                           parameters_are_free: bool = True, rules: Collection[str] = (),
                           max_dist_from_bw: int = MAX_DIST_FROM_BW,
                           fraction_of: str = "span") -> BudgetedPartition:
    """The cut to take under one budget (see the module doc): ``fraction`` (0 to 1; of the
    recompute-everything to runtime-optimal span, or with ``fraction_of="runtime_optimal"``
    of the runtime-optimal cut's saved bytes, torch's meaning),
    ``max_saved_bytes`` (a cap on the saved values' bytes) or ``max_peak_bytes`` (a cap on the
    simulated peak, inputs included). ``knapsack``: "dp", "greedy" or "ilp". ``bans``,
    ``release``, ``solver``, ``recompute_views``, ``parameters_are_free``, ``rules`` and
    ``max_dist_from_bw`` are ``partition``'s; the rules' bans hold in the runtime-optimal cut
    and are knapsack items a tighter budget may lift, as front-end bans are (category bans:
    never). Deterministic; raises UnreachableMemoryBudgetError when no cut meets a cap."""
    if not isinstance(graph, CoreGraph):  # a CoreGraph keeps the search for the next budget
        graph = CoreGraph(tuple(graph))
    budget = _budget(fraction, max_saved_bytes, max_peak_bytes, fraction_of)
    if knapsack not in KNAPSACK_SOLVERS:
        raise CoreGraphError(f"unknown knapsack solver {knapsack!r}; valid: "
                             f"{', '.join(sorted(KNAPSACK_SOLVERS))}")
    if bans is not None and not isinstance(bans, Mapping):
        raise CoreGraphError(f"bans must be a mapping of node id to reason, got {bans!r}")
    check_has_backward(graph)
    release = check_release(graph, release)
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Collection):
        raise CoreGraphError(f"rules must be a collection of rule names, got {rules!r}")
    options = {"solver": solver, "recompute_views": recompute_views,
               "parameters_are_free": parameters_are_free, "rules": tuple(rules),
               "max_dist_from_bw": max_dist_from_bw}
    search = _search(graph, dict(bans or {}), release, knapsack, options)
    chosen = _choose(search, budget)
    lifted = search.optimal.result.banned
    return BudgetedPartition(chosen.result, budget, chosen.label,
                             {name: lifted[name] for name in chosen.released},
                             chosen.saved_bytes, chosen.recompute_runtime, chosen)
