"""What a partition decided, as data: which values were saved or recomputed, and why.

The partitioner builds a ``PartitionReport`` from its result (``build_report``) and logs it at
DEBUG level; ``partitioners.explain_partition`` returns it (what ``aot-pipeline partition``
prints). Nothing here runs a partition.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from ..config import PartitionConfig
from ..fx.classify import NodeInfo
from ..fx.joint import is_primal
from ..fx.passes.rng import RNG_STATE_PREFIX
from ..fx.sizes import is_opaque, node_nbytes, saved_activation_bytes

if TYPE_CHECKING:
    from ..budget.reference import ReferenceCheck
    from ..budget.regions import RegionOutcome
    from ..fx.solve import MinCutSolution

log = logging.getLogger(__name__)

SAVED, RECOMPUTED, BACKWARD_ONLY = "saved", "recomputed", "backward-only"


@dataclass
class NodeDecision:
    name: str
    op: str          # str(node.target)
    nbytes: int
    decision: str    # "saved" | "recomputed" | "backward-only"
    reason: str      # why, e.g. "cut: cheapest place to cut", "banned: reduction: ..."


def format_size(nbytes: int) -> str:
    """``nbytes`` for a budget's words: "512 bytes", "2.0 KiB (2048 bytes)"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


@dataclass(frozen=True)
class GivenBudget:
    """The budget a partition was given, as the caller gave it (what the report names).

    ``kind``: "fraction" (``fraction`` of the way from the least to the runtime-optimal
    saved bytes), "caps" (``saved_bytes_cap`` and/or ``peak_cap``, in bytes; any fraction is
    then ignored), "regions" (``regions``: one label per region budget, then the rest's
    fraction) or "none" (the default partition: no budget applies). ``source`` says where a
    fraction came from when not from the call or config ("a region over the whole forward",
    "a MemoryBudgetMode marker")."""

    kind: str
    fraction: float | None = None
    saved_bytes_cap: int | None = None
    peak_cap: int | None = None
    regions: tuple[str, ...] = ()
    source: str | None = None
    peak_fraction: float | None = None  # a peak cap as a fraction of the runtime-optimal cut's

    def describe(self) -> str:
        """The budget in words: "memory budget 0.5", "saved-bytes cap 2.0 KiB (2048 bytes)",
        "simulated peak cap 1.0 MiB (1048576 bytes)", "region budgets: region 0.25, rest
        (global 1)", "no memory budget (default partition)"."""
        if self.kind == "none":
            return "no memory budget (default partition)"
        if self.kind == "regions":
            return f"region budgets: {', '.join(self.regions)}"
        if self.kind == "caps":
            words = []
            if self.saved_bytes_cap is not None:
                words.append(f"saved-bytes cap {format_size(self.saved_bytes_cap)}")
            if self.peak_cap is not None:
                words.append(f"simulated peak cap {format_size(self.peak_cap)}")
            if self.peak_fraction is not None:
                words.append(f"simulated peak cap {self.peak_fraction:g} of the runtime-optimal "
                             "cut's")
            return " and ".join(words)
        source = f" (from {self.source})" if self.source is not None else ""
        return f"memory budget {self.fraction:g}{source}"

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (trace.py's decisions page): kind, values and the words."""
        return {"kind": self.kind, "fraction": self.fraction,
                "saved_bytes_cap": self.saved_bytes_cap, "peak_cap": self.peak_cap,
                "peak_fraction": self.peak_fraction, "regions": list(self.regions), "source": self.source,
                "describe": self.describe()}


def given_budget(fraction: float, *, saved_bytes_cap: int | None = None,
                 peak_cap: int | None = None, regions: tuple[str, ...] = (),
                 source: str | None = None, peak_fraction: float | None = None) -> GivenBudget:
    """The ``GivenBudget`` of a min-cut partition: caps win over the fraction, regions (not
    over the whole forward) are their own kind."""
    if regions:
        return GivenBudget("regions", regions=regions)
    if saved_bytes_cap is not None or peak_cap is not None or peak_fraction is not None:
        return GivenBudget("caps", saved_bytes_cap=saved_bytes_cap, peak_cap=peak_cap,
                           peak_fraction=peak_fraction)
    return GivenBudget("fraction", fraction=fraction, source=source)


@dataclass
class PartitionReport:
    saved: list[NodeDecision]
    recomputed: list[NodeDecision]
    banned: dict[str, str]          # node name -> why it may not be recomputed
    memory_budget: float            # the fraction in force (ignored under caps: see budget)
    # What the saved values keep alive beyond the inputs: the one measure (sizes.saved_bytes
    # of the forward's saved outputs, RNG states and symbolic scalars included).
    saved_bytes: int
    solver: str
    notes: list[str] = field(default_factory=list)
    # The ban rules on in the cut that chose the saved values (policy.active_rule_names).
    active_rules: tuple[str, ...] = ()
    config: PartitionConfig | None = None      # the settings the partition ran under
    memory_budget_bytes: int | None = None     # the cap on activation bytes, if one was set
    # Under a byte cap: the bytes it was held to (caps.activation_bytes: the one measure of
    # the chosen cut, equal to saved_bytes).
    activation_bytes: int | None = None
    peak_bytes: int | None = None              # the cap on the simulated peak, if one was set
    # Under a peak cap: the chosen cut's modelled forward+backward peak (caps.SimulatedPeak:
    # absolute, the step's inputs and parameters included) and the model that priced it
    # ("inductor" or "eager": memory_models/pricing.py).
    simulated_peak_bytes: int | None = None
    memory_model: str | None = None
    # At a fraction between 0 and 1: the reference check (reference.py), None when it did not
    # apply (budget 0 or 1, a byte cap, the estimator is the reference, or it is off).
    reference_check: ReferenceCheck | None = None
    # The memory-budget sweep, when the partition ran one (flag visualize_memory_budget_pareto),
    # and the PNG it wrote. pareto.ParetoPoint values (pareto.py sits above this module).
    pareto_points: tuple[Any, ...] = ()
    pareto_png: str | None = None
    # Under region budgets (several, or not over the whole forward): one row per region and
    # one for the rest of the graph, with its budget, limit and saved bytes.
    regions: list[RegionOutcome] = field(default_factory=list)
    # Saved values offloaded to host memory (fx/offload.py), reason "offloaded: <bytes> over
    # <window> (<who asked>)"; they are also in ``saved`` (the host copy is what is saved).
    offloaded: list[NodeDecision] = field(default_factory=list)
    # The budget the partition was given (None: built without one; format() then names the
    # fraction).
    budget: GivenBudget | None = None

    @property
    def given_budget(self) -> GivenBudget:
        return self.budget if self.budget is not None else given_budget(self.memory_budget)

    def format(self) -> str:
        """A plain-text table for terminals."""
        lines = [f"{self.given_budget.describe()}, solver {self.solver}, "
                 f"saved {self.saved_bytes} bytes in {len(self.saved)} values"]
        if self.peak_bytes is not None:
            lines.append(f"simulated peak {self.simulated_peak_bytes} bytes (forward+backward, "
                         f"inputs and parameters included; {self.memory_model} memory model)")
        if self.reference_check is not None:
            lines.append(self.reference_check.describe())
        lines.extend(region.describe() for region in self.regions)
        if self.active_rules:
            lines.append(f"ban rules: {', '.join(self.active_rules)}")
        for title, rows in (("saved", self.saved), ("recomputed", self.recomputed),
                            ("offloaded", self.offloaded)):
            if title == "offloaded" and not rows:
                continue
            lines.append(f"{title}:")
            lines.extend(f"  {d.name:<28} {d.op:<36} {d.nbytes:>10}  {d.reason}" for d in rows)
        if self.banned:
            lines.append("banned from recomputation:")
            lines.extend(f"  {name:<28} {why}" for name, why in self.banned.items())
        lines.extend(f"note: {note}" for note in self.notes)
        if self.pareto_points:
            lines.append(f"pareto: {len(self.pareto_points)} budgets swept, picture "
                         f"{self.pareto_png}")
        return "\n".join(lines)


def _saved_reason(node: fx.Node, banned: dict[fx.Node, str], solution: Any) -> str:
    policy = node.meta.get("recompute")
    if policy == CheckpointPolicy.MUST_SAVE:
        return "MUST_SAVE annotation"
    if is_opaque(node):
        return "opaque object: never sized or recomputed, always available to the backward"
    if is_primal(node):
        return "input: already alive, saving costs no new memory"
    if node in banned:
        return f"banned: {banned[node]}"
    if policy == CheckpointPolicy.PREFER_SAVE:
        return "PREFER_SAVE annotation"
    if solution is None:
        return "memory budget: chosen by the knapsack"
    return "cut: cheapest place to cut"


def _recomputed_reason(node: fx.Node, replayed: set[str]) -> str:
    policy = node.meta.get("recompute")
    replay = ", replaying the forward's RNG state" if node.name in replayed else ""
    if policy in (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE):
        return f"{policy.name} annotation{replay}"
    return f"recomputed: cheaper to recompute from saved values than to save{replay}"


def _decision(node: fx.Node, decision: str, reason: str) -> NodeDecision:
    try:
        nbytes = node_nbytes(node)
    except Exception:  # sizing is informative only here
        nbytes = 0
    return NodeDecision(node.name, str(node.target), nbytes, decision, reason)


def build_report(saved_values: list[fx.Node], saved_sym_nodes: list[fx.Node],
                 fw_module: fx.GraphModule, bw_module: fx.GraphModule, num_fwd_outputs: int,
                 node_info: NodeInfo, solution: MinCutSolution | None, memory_budget: float,
                 replayed: list[str] | None = None, *, solver: str | None = None
                 ) -> PartitionReport:
    """``replayed``: names of the random ops the backward recomputes on the forward's RNG
    state (their states are saved too, and counted in ``saved_bytes``: the one measure of
    what ``fw_module`` saves). ``solver`` names what chose the saved values when no min cut
    did (default "inputs only")."""
    banned = solution.banned if solution is not None else {}
    replayed_set = set(replayed or ())
    saved = [_decision(n, SAVED, _saved_reason(n, banned, solution))
             for n in [*saved_values, *saved_sym_nodes]]
    forward_by_name = {n.name: n for n in node_info.required_fw}
    recomputed_names = [n.name for n in bw_module.graph.nodes
                        if n.op == "call_function" and n.name in forward_by_name]
    # A replayed op runs under run_with_rng_state in the backward, under another name.
    recomputed_names += sorted(replayed_set - set(recomputed_names))
    recomputed = [
        _decision(forward_by_name[name], RECOMPUTED,
                  _recomputed_reason(forward_by_name[name], replayed_set))
        for name in recomputed_names if name in forward_by_name
    ]
    state_bytes = [node_nbytes(p) for p in bw_module.graph.find_nodes(op="placeholder")
                   if p.name.startswith(RNG_STATE_PREFIX)]
    nbytes_saved = saved_activation_bytes(fw_module, num_fwd_outputs)
    notes = []
    if replayed_set:
        notes.append(f"{len(replayed_set)} recomputed random op(s) replay the forward's RNG "
                     f"state ({sum(state_bytes)} bytes saved for it): "
                     f"{', '.join(sorted(replayed_set))}")
    return PartitionReport(
        saved=saved,
        recomputed=recomputed,
        banned={n.name: why for n, why in banned.items()},
        memory_budget=memory_budget,
        saved_bytes=nbytes_saved,
        solver=solution.solver if solution is not None else solver or "inputs only",
        notes=notes,
    )


def default_partition_report(saved_values: list[fx.Node], saved_sym_nodes: list[fx.Node],
                             config: PartitionConfig, fw_module: fx.GraphModule,
                             num_fwd_outputs: int) -> PartitionReport:
    """What ``default_partition`` decided: it saves every forward value the backward reads
    (``saved_values``, ``saved_sym_nodes``: what extraction kept) and recomputes nothing (no
    budget applies); ``saved_bytes`` is the one measure of what ``fw_module`` saves."""
    saved = [_decision(n, SAVED, "default partition: the backward reads it")
             for n in [*saved_values, *saved_sym_nodes]]
    return PartitionReport(saved, [], {}, 1.0,
                           saved_activation_bytes(fw_module, num_fwd_outputs),
                           "default partition (no budget)", config=config,
                           budget=GivenBudget("none"))


def log_report(report: PartitionReport) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return
    for d in report.saved:
        log.debug("saved %s (%s, %d bytes): %s", d.name, d.op, d.nbytes, d.reason)
    for d in report.recomputed:
        log.debug("recomputed %s (%s, %d bytes): %s", d.name, d.op, d.nbytes, d.reason)
    for name, why in report.banned.items():
        log.debug("banned %s: %s", name, why)

