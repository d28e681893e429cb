"""The activation planner: keep, recompute or offload each saved value, under a budget.

Offloading v copies it to host memory after its last forward use and back before its first
backward use. Its cost is ``bytes / bandwidth`` each way (fx/offload.py's
``host_link_bandwidth``, the flag ``activation_offload_cpu_gpu_bw``) less what
the compute in between hides (``offload_windows``: roofline seconds on the joint's
forward+backward order); its gain is the device memory freed over that window.

- ``plan_offload(joint_graph, saved_values, config)``: which already-saved values to offload
  (names): those whose copies hide entirely, biggest gain first, while the copies fit the
  link. The offload mechanism (fx/offload.py) calls it.
- ``plan_activations(search, fraction)``: keep / recompute / offload over the whole forward at a
  fraction budget, as one MILP (core/offload_milp.py) proven within 1%, with the "dp" answer as
  the incumbent (never worse than it, no more device bytes than it saves) and no wall-clock
  in the decision.
- ``plan_within_bytes(search, nbytes)``: the same under a cap on device bytes.
- ``plan_under_peak(...)``: the fastest plan whose simulated forward+backward peak (offloaded
  values freed over their window, as memory_models/simulator.py simulates the rewritten graphs) fits a
  cap, among a fixed set of plans; monotone in the
  cap, ``UnreachableMemoryBudgetError`` (caps.py's wording) with the least reachable peak.
- ``parse_memory_budget``: ``0.5``, ``"300MiB"`` (saved bytes) or ``"20GiB peak"``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from ..core.ilp_graph import SaveOrRecompute
from ..core.offload_milp import (
    OFFLOAD_MILP_NODE_LIMIT,
    KeepRecomputeOffload,
    KeepRecomputeOffloadAnswer,
    evaluate_plan,
    least_saved_bytes,
    solve_keep_recompute_offload,
)
from ..costs import roofline
from ..costs.cut_runtime import step_estimate
from ..costs.estimators import estimate_runtime
from ..errors import UnreachableMemoryBudgetError
from ..fx.cut import extract_cut, finish_cut
from ..fx.joint import is_bwd_seed_offset, is_tangent
from ..fx.offload import host_link_bandwidth, offload_obstacle, offload_saved_values
from ..fx.regions import parse_region_budget
from ..fx.sizes import node_nbytes
from ..memory_models import simulator as memory
from .candidates import BYTE_BUDGET_FRACTIONS
from .caps import validate_memory_budget_bytes, validate_peak_bytes
from .search import BudgetSearch, _ilp_forward_nodes, _ilp_savable, validate_memory_budget

log = logging.getLogger(__name__)

__all__ = [
    "OFFLOAD_MIN_BYTES",
    "PEAK_PLAN_FRACTIONS",
    "ActivationPlan",
    "MemoryBudget",
    "PeakPlan",
    "choose_under_peak",
    "measure_plan",
    "offload_windows",
    "parse_memory_budget",
    "peak_candidates",
    "plan_activations",
    "plan_offload",
    "plan_within_bytes",
    "plan_under_peak",
]

# Smaller values are not worth a copy's launch and event (and never offloaded).
OFFLOAD_MIN_BYTES = 2**20
# The fractions whose plans a peak cap chooses among (fixed: monotone in the cap).
PEAK_PLAN_FRACTIONS = tuple(i / 16 for i in range(16, -1, -1))

# ---- budgets as written -----------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryBudget:
    """One of: a fraction of the runtime-optimal activations, a cap on saved bytes, or a cap
    on the simulated forward+backward peak."""

    fraction: float | None = None
    nbytes: int | None = None
    peak_bytes: int | None = None


def parse_memory_budget(value: object) -> MemoryBudget:
    """``0.5`` (fraction), ``300 * 2**20`` or ``"300MiB"`` (saved bytes), ``"20GiB peak"``
    (simulated peak). ValueError naming the valid forms otherwise."""
    valid = ("a fraction in [0, 1], a byte cap ('300MiB' or an int >= 2) or a peak cap "
             "('20GiB peak')")
    if isinstance(value, str) and value.strip().lower().endswith(" peak"):
        size = value.strip()[: -len(" peak")]
        try:
            parsed = parse_region_budget(size)
        except ValueError:
            parsed = None
        if parsed is None or parsed.nbytes is None:
            raise ValueError(f"memory budget must be {valid}; got {value!r}")
        return MemoryBudget(peak_bytes=parsed.nbytes)
    try:
        parsed = parse_region_budget(value)
    except ValueError:
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        raise ValueError(f"memory budget must be {valid}; got {shown!r}") from None
    if parsed.fraction is not None:
        return MemoryBudget(fraction=parsed.fraction)
    return MemoryBudget(nbytes=parsed.nbytes)


# ---- costs of an offload ----------------------------------------------------------------------

def _link_bandwidth(config: Any, device: torch.device | None,
                    bandwidth_gbps: float | None) -> float:
    """Bytes/s one way between ``device`` (default: the CPU) and host memory: fx/offload.py's
    ``host_link_bandwidth`` with ``bandwidth_gbps``, else the config's
    ``offload_bandwidth_gbps`` (flag ``activation_offload_cpu_gpu_bw``; no config: None)."""
    if bandwidth_gbps is None and config is not None:
        bandwidth_gbps = config.offload_bandwidth_gbps
    return host_link_bandwidth(device or torch.device("cpu"), bandwidth_gbps)


def _backward_nodes(joint_graph: fx.Graph) -> set[fx.Node]:
    """The nodes that depend on a tangent (or the backward's RNG seed): the backward."""
    found: set[fx.Node] = set()
    for node in joint_graph.nodes:
        if (node.op == "placeholder" and (is_tangent(node) or is_bwd_seed_offset(node))) or \
                any(arg in found for arg in node.all_input_nodes):
            found.add(node)
    return found


@dataclass(frozen=True)
class _Schedule:
    """The joint in order: each node's place, start time (roofline s) and phase."""

    position: dict[fx.Node, int]
    start: np.ndarray            # seconds before node i runs; start[-1]: the whole step
    backward: set[fx.Node]
    forward_s: float
    backward_s: float


def _schedule(joint_graph: fx.Graph) -> _Schedule:
    nodes = list(joint_graph.nodes)
    backward = _backward_nodes(joint_graph)
    seconds = np.array([estimate_runtime(n, "roofline") if n.op == "call_function" else 0.0
                        for n in nodes])
    start = np.concatenate([[0.0], np.cumsum(seconds)])
    is_bw = np.array([n in backward for n in nodes], dtype=bool)
    return _Schedule({n: i for i, n in enumerate(nodes)}, start, backward,
                     float(seconds[~is_bw].sum()), float(seconds[is_bw].sum()))


def offload_windows(joint_graph: fx.Graph, nodes: Sequence[fx.Node] | None = None
                    ) -> dict[fx.Node, float]:
    """Per forward node a backward node reads: the roofline seconds of the compute between
    its last forward use and its first backward use (what can hide its copies)."""
    return _windows(joint_graph, _schedule(joint_graph), nodes)


def _windows(joint_graph: fx.Graph, schedule: _Schedule, nodes: Sequence[fx.Node] | None
             ) -> dict[fx.Node, float]:
    out: dict[fx.Node, float] = {}
    for node in (nodes if nodes is not None else joint_graph.nodes):
        if node in schedule.backward:
            continue
        users = [u for u in node.users if u.op != "output"]
        bw_users = [schedule.position[u] for u in users if u in schedule.backward]
        if not bw_users:
            continue
        fw_last = max([schedule.position[node], *(schedule.position[u] for u in users
                                                  if u not in schedule.backward)])
        out[node] = max(float(schedule.start[min(bw_users)] - schedule.start[fw_last + 1]), 0.0)
    return out


def _offloadable(node: fx.Node, min_bytes: int) -> bool:
    """A computed tensor the mechanism can offload (fx/offload.py's ``offload_obstacle``: of
    its own dense storage, not MUST_SAVE), big enough, with no user tag (SAC policies' tags
    win), not a user output."""
    val = node.meta.get("val")
    return (node.op == "call_function" and isinstance(val, torch.Tensor)
            and not roofline.moves_nothing(node) and node_nbytes(node) >= min_bytes
            and "recompute" not in node.meta
            and not any(u.op == "output" for u in node.users)
            and offload_obstacle(node, {node}, ()) is None)


def _copy_costs(node: fx.Node, window: float, bandwidth: float) -> tuple[float, float]:
    """(one-way copy seconds, seconds not hidden by ``window``)."""
    transfer = node_nbytes(node) / bandwidth
    return transfer, max(2 * transfer - window, 0.0)


def plan_offload(joint_graph: fx.Graph, saved_values: Sequence[fx.Node], config: Any, *,
                 bandwidth_gbps: float | None = None, min_bytes: int = OFFLOAD_MIN_BYTES
                 ) -> list[str]:
    """Names of the ``saved_values`` to offload, in graph order: the offloadable ones whose
    copies the compute between their last forward and first backward use hides entirely,
    biggest gain (bytes times window) first, while the copies fit the link (one copy stream
    each way: their total time within the forward's compute, and the backward's)."""
    saved_values = list(saved_values)
    schedule = _schedule(joint_graph)
    windows = _windows(joint_graph, schedule, saved_values)
    device = next((v.device for n in saved_values
                   if isinstance(v := n.meta.get("val"), torch.Tensor)), None)
    bandwidth = _link_bandwidth(config, device, bandwidth_gbps)
    link = min(schedule.forward_s, schedule.backward_s)
    chosen: list[fx.Node] = []
    used = 0.0
    candidates = [n for n in saved_values if n in windows and _offloadable(n, min_bytes)]
    for node in sorted(candidates, key=lambda n: (-node_nbytes(n) * windows[n],
                                                  schedule.position[n])):
        transfer, exposed = _copy_costs(node, windows[node], bandwidth)
        if exposed == 0.0 and used + transfer <= link:
            chosen.append(node)
            used += transfer
    log.info("plan_offload: %d of %d saved values offloaded (%d bytes)", len(chosen),
             len(saved_values), sum(node_nbytes(n) for n in chosen))
    return [n.name for n in sorted(chosen, key=schedule.position.__getitem__)]


# ---- the whole-graph planner ------------------------------------------------------------------

@dataclass(frozen=True)
class ActivationPlan:
    """What happens to each forward value the backward needs."""

    kept: tuple[fx.Node, ...]       # saved on the device (graph inputs included)
    offloaded: tuple[fx.Node, ...]  # saved, but on the host over their window
    recomputed: frozenset[fx.Node]
    recompute_s: float              # roofline seconds recomputed
    exposed_s: float                # copy seconds not hidden
    device_bytes: float             # bytes of ``kept``
    offloaded_bytes: float
    gap: float                      # proven relative optimality gap
    source: str                     # "milp", "lp rounding" or "reference" (the dp answer)
    label: str = ""
    reference_s: float | None = None  # the "dp" answer's recompute seconds, evaluated alike

    @property
    def saved(self) -> list[fx.Node]:
        """What the forward hands the backward (kept and offloaded), in graph order."""
        nodes = [*self.kept, *self.offloaded]
        if not nodes:
            return []
        order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
        return sorted(nodes, key=order.__getitem__)

    @property
    def runtime(self) -> float:
        return self.recompute_s + self.exposed_s


def _dp_answer(search: BudgetSearch, fraction: float) -> list[fx.Node]:
    dp = search if search.solver == "dp" else replace(search, solver="dp")
    return list(dp.saved_values(fraction)[0])


@dataclass(frozen=True)
class _Planning:
    """One search's problem without its capacity: the MILP's nodes and their costs."""

    problem: KeepRecomputeOffload
    forward: list[fx.Node]
    inputs: list[fx.Node]

    def device_bytes(self, saved: Sequence[fx.Node]) -> float:
        """The bytes the MILP counts for saving ``saved`` (forward nodes and inputs)."""
        chosen = set(saved)
        sizes = self.problem.base.sizes
        return float(sum(sizes[i] for i, node in enumerate(self.forward + self.inputs)
                         if node in chosen))

    def solve(self, capacity: float, reference: Sequence[fx.Node], label: str,
              node_limit: int) -> ActivationPlan | None:
        """The plan within ``capacity`` with ``reference`` as the incumbent; None when
        nothing fits."""
        problem = replace(self.problem, base=replace(self.problem.base, capacity=capacity))
        chosen = set(reference)
        incumbent = evaluate_plan(problem, np.array([v in chosen for v in self.forward]),
                                  np.zeros(len(self.forward), dtype=bool),
                                  np.array([u in chosen for u in self.inputs]))
        answer = solve_keep_recompute_offload(problem, reference=incumbent,
                                              node_limit=node_limit)
        if answer is None:
            return None
        return replace(_plan_of(answer, self.forward, self.inputs, label),
                       reference_s=None if incumbent is None else incumbent.runtime)


def _planning(search: BudgetSearch, offload: bool, bandwidth_gbps: float | None,
              min_bytes: int) -> _Planning:
    """Describe ``search``'s forward as arrays (capacity 0: ``_Planning.solve`` sets it)."""
    info = search.node_info
    if search.has_range:
        search._escalate()  # the knapsack items and their bans
    forward = _ilp_forward_nodes(search)
    inputs = list(info.inputs)
    index = {node: i for i, node in enumerate(forward)}
    n = len(forward)
    index.update((node, n + k) for k, node in enumerate(inputs))
    forward_set = set(forward)
    still_banned = set(search.aggressive_banned) - set(search.candidates)
    bw_outputs = set(info.bw_outputs)
    read_by_backward = [node in bw_outputs or any(u not in forward_set and u.op != "output"
                                                  for u in node.users)
                        for node in forward + inputs]
    base = SaveOrRecompute(
        sizes=np.array([node_nbytes(node) for node in forward + inputs], dtype=np.float64),
        runtimes=np.array([estimate_runtime(node, "roofline") for node in forward]),
        read_by_backward=np.array(read_by_backward, dtype=bool),
        recomputable=np.array([node not in still_banned for node in forward], dtype=bool),
        reads=[[index[a] for a in node.all_input_nodes if a in index] for node in forward],
        capacity=0.0,
        estimator="roofline",
        savable=np.array([_ilp_savable(node) for node in forward], dtype=bool),
    )
    schedule = _schedule(search.joint_graph)
    windows = _windows(search.joint_graph, schedule, forward)
    device = next((v.device for node in forward
                   if isinstance(v := node.meta.get("val"), torch.Tensor)), None)
    bandwidth = _link_bandwidth(search.config, device, bandwidth_gbps)
    transfer = np.zeros(n)
    exposed = np.full(n, math.inf)
    for v, node in enumerate(forward):
        if offload and node in windows and _offloadable(node, min_bytes):
            transfer[v], exposed[v] = _copy_costs(node, windows[node], bandwidth)
    problem = KeepRecomputeOffload(base, exposed, transfer,
                                   link_s=min(schedule.forward_s, schedule.backward_s))
    return _Planning(problem, forward, inputs)


def plan_activations(search: BudgetSearch, memory_budget: float, *, offload: bool = True,
                     bandwidth_gbps: float | None = None, min_bytes: int = OFFLOAD_MIN_BYTES,
                     node_limit: int = OFFLOAD_MILP_NODE_LIMIT) -> ActivationPlan:
    """Keep / recompute / offload at a fraction budget (see module doc); ``offload=False``:
    keep or recompute only. Runtimes are roofline seconds whatever the search's estimator
    (copies are in seconds). The "dp" answer at the fraction is the incumbent and caps the
    device bytes, so the plan never recomputes more (runtime) nor keeps more than it."""
    memory_budget = validate_memory_budget(memory_budget)
    search = search.with_estimator("roofline")
    reference = _dp_answer(search, memory_budget)
    planning = _planning(search, offload, bandwidth_gbps, min_bytes)
    reference_bytes = planning.device_bytes(reference)
    capacity = search.min_bytes + memory_budget * (search.max_bytes - search.min_bytes)
    capacity = min(capacity, reference_bytes) if memory_budget < 1 else reference_bytes
    label = f"plan {memory_budget:g}" + ("" if offload else " (no offload)")
    plan = planning.solve(capacity, reference, label, node_limit)
    if plan is None:  # the dp answer is no forward-node set (nothing to plan): take it
        log.info("plan_activations: at %g the dp answer is kept as is", memory_budget)
        return ActivationPlan(tuple(reference), (), frozenset(), 0.0, 0.0, reference_bytes,
                              0.0, 0.0, "reference", label)
    return plan


def plan_within_bytes(search: BudgetSearch, nbytes: int, *, offload: bool = True,
                      bandwidth_gbps: float | None = None, min_bytes: int = OFFLOAD_MIN_BYTES,
                      node_limit: int = OFFLOAD_MILP_NODE_LIMIT) -> ActivationPlan:
    """Keep / recompute / offload with at most ``nbytes`` saved on the device (forward values
    and kept inputs, as the MILP counts them). The incumbent is the "dp" answer at the highest
    of ``BYTE_BUDGET_FRACTIONS`` that fits (a bisection). UnreachableMemoryBudgetError, as
    caps.py words it, when no plan fits, with the least bytes any plan keeps."""
    nbytes = validate_memory_budget_bytes(nbytes)
    search = search.with_estimator("roofline")
    planning = _planning(search, offload, bandwidth_gbps, min_bytes)
    fractions = BYTE_BUDGET_FRACTIONS  # high to low
    low, high = 0, len(fractions)  # the first fitting index lies in [low, high]
    while low < high:
        mid = (low + high) // 2
        if planning.device_bytes(_dp_answer(search, fractions[mid])) <= nbytes:
            high = mid
        else:
            low = mid + 1
    reference = _dp_answer(search, fractions[low]) if low < len(fractions) else []
    label = f"plan within {nbytes} bytes" + ("" if offload else " (no offload)")
    plan = planning.solve(float(nbytes), reference, label, node_limit)
    if plan is None:
        least = least_saved_bytes(planning.problem, node_limit=node_limit)
        raise UnreachableMemoryBudgetError("activation memory budget", nbytes,
                                           math.ceil(least) if least is not None else -1,
                                           "least-bytes plan" if least is not None
                                           else "no plan exists", "save")
    return plan


def _plan_of(answer: KeepRecomputeOffloadAnswer, forward: list[fx.Node],
             inputs: list[fx.Node], label: str) -> ActivationPlan:
    kept = [forward[v] for v in np.flatnonzero(answer.save)]
    kept += [inputs[k] for k in np.flatnonzero(answer.keep)]
    return ActivationPlan(
        kept=tuple(kept), offloaded=tuple(forward[v] for v in np.flatnonzero(answer.offload)),
        recomputed=frozenset(forward[v] for v in np.flatnonzero(answer.recompute)),
        recompute_s=answer.recompute_s, exposed_s=answer.exposed_s,
        device_bytes=answer.saved_bytes, offloaded_bytes=answer.offloaded_bytes,
        gap=answer.gap, source=answer.source, label=label)


# ---- the peak budget --------------------------------------------------------------------------

@dataclass(frozen=True)
class PeakPlan:
    """A plan and what one step with it measures in the simulation."""

    plan: ActivationPlan
    peak_bytes: int
    step_s: float            # roofline seconds of the forward and backward + exposed copies
    timeline: memory.MemoryTimeline


def measure_plan(plan: ActivationPlan, joint_module: fx.GraphModule, num_fwd_outputs: int,
                 *, static_input_indices: Sequence[int] | None = None,
                 bandwidth_gbps: float | None = None) -> PeakPlan:
    """Simulate one step under ``plan``: its graphs as the partition builds them, with the
    offloaded values rewritten by fx/offload.py and simulated by memory_models/simulator.py (freed over
    their window, transfers recorded), the plan's exposed copies charged. ``bandwidth_gbps``:
    the host link (None: fx/offload.py's device table)."""
    cut = extract_cut(joint_module, plan.saved, num_fwd_outputs=num_fwd_outputs)
    step = step_estimate(cut.fw, cut.bw, "roofline") + plan.exposed_s
    finish_cut(cut)
    offload_saved_values(cut.fw, cut.bw, dict.fromkeys((n.name for n in plan.offloaded),
                                                       "planner"),
                         num_fwd_outputs=num_fwd_outputs, bandwidth_gbps=bandwidth_gbps)
    static = None if static_input_indices is None else tuple(static_input_indices)
    timeline = memory.simulate_partition(cut.fw, cut.bw, static_input_indices=static)
    return PeakPlan(plan, int(timeline.peak_bytes), step, timeline)


def peak_candidates(search: BudgetSearch, joint_module: fx.GraphModule, num_fwd_outputs: int,
                    *, static_input_indices: Sequence[int] | None = None,
                    bandwidth_gbps: float | None = None, min_bytes: int = OFFLOAD_MIN_BYTES,
                    fractions: Sequence[float] = PEAK_PLAN_FRACTIONS) -> list[PeakPlan]:
    """The plans a peak cap chooses among, measured: at each of ``fractions``, with and
    without offload; a plan found twice keeps its first place. None depends on a cap."""
    if bandwidth_gbps is None and search.config is not None:
        bandwidth_gbps = search.config.offload_bandwidth_gbps
    found: dict[tuple[frozenset[fx.Node], frozenset[fx.Node]], ActivationPlan] = {}
    for fraction in fractions:
        for offload in (False, True):
            plan = plan_activations(search, fraction, offload=offload,
                                    bandwidth_gbps=bandwidth_gbps, min_bytes=min_bytes)
            found.setdefault((frozenset(plan.kept), frozenset(plan.offloaded)), plan)
    return [measure_plan(plan, joint_module, num_fwd_outputs,
                         static_input_indices=static_input_indices,
                         bandwidth_gbps=bandwidth_gbps)
            for plan in found.values()]


def choose_under_peak(candidates: Sequence[PeakPlan], peak_bytes: int) -> PeakPlan:
    """The fastest candidate whose simulated peak fits ``peak_bytes`` (then the lower peak,
    then the earlier one). Monotone: the candidates do not depend on the cap, so a lower cap
    only removes some, and the answer's step time never falls as the cap falls.
    UnreachableMemoryBudgetError (as caps.py words it) when none fits."""
    peak_bytes = validate_peak_bytes(peak_bytes)
    fitting = [(c.step_s, c.peak_bytes, i, c) for i, c in enumerate(candidates)
               if c.peak_bytes <= peak_bytes]
    if not fitting:
        least = min(candidates, key=lambda c: c.peak_bytes)
        raise UnreachableMemoryBudgetError("simulated memory peak cap", peak_bytes,
                                           least.peak_bytes, least.plan.label, "peak at")
    return min(fitting, key=lambda t: t[:3])[3]


def plan_under_peak(search: BudgetSearch, joint_module: fx.GraphModule, num_fwd_outputs: int,
                    peak_bytes: int, *, static_input_indices: Sequence[int] | None = None,
                    bandwidth_gbps: float | None = None, min_bytes: int = OFFLOAD_MIN_BYTES
                    ) -> PeakPlan:
    """The fastest plan under a cap on the simulated peak (``"20GiB peak"``); see
    ``choose_under_peak``. Sweeps of caps should call ``peak_candidates`` once."""
    validate_peak_bytes(peak_bytes)
    candidates = peak_candidates(search, joint_module, num_fwd_outputs,
                                 static_input_indices=static_input_indices,
                                 bandwidth_gbps=bandwidth_gbps, min_bytes=min_bytes)
    return choose_under_peak(candidates, peak_bytes)
