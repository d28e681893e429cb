"""Explain a partition: which values were saved or recomputed, and why.

``explain_partition`` is what ``aot-pipeline partition`` prints; the partitioners log the
same decisions at DEBUG level.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from .classify import NodeInfo, is_primal
from .sizes import node_nbytes

if TYPE_CHECKING:
    from .solve import MinCutSolution

log = logging.getLogger(__name__)

SAVED, RECOMPUTED, BACKWARD_ONLY = "saved", "recomputed", "backward-only"


@dataclass
class NodeDecision:
    name: str
    op: str          # str(node.target)
    nbytes: int
    decision: str    # "saved" | "recomputed" | "backward-only"
    reason: str      # why, e.g. "cut: cheapest place to cut", "banned: reduction: ..."


@dataclass
class PartitionReport:
    saved: list[NodeDecision]
    recomputed: list[NodeDecision]
    banned: dict[str, str]          # node name -> why it may not be recomputed
    memory_budget: float
    saved_bytes: int                # bytes of saved tensors (symbolic scalars not counted)
    solver: str
    notes: list[str] = field(default_factory=list)

    def format(self) -> str:
        """A plain-text table for terminals."""
        lines = [f"memory budget {self.memory_budget:g}, solver {self.solver}, "
                 f"saved {self.saved_bytes} bytes in {len(self.saved)} values"]
        for title, rows in (("saved", self.saved), ("recomputed", self.recomputed)):
            lines.append(f"{title}:")
            lines.extend(f"  {d.name:<28} {d.op:<36} {d.nbytes:>10}  {d.reason}" for d in rows)
        if self.banned:
            lines.append("banned from recomputation:")
            lines.extend(f"  {name:<28} {why}" for name, why in self.banned.items())
        return "\n".join(lines)


def _saved_reason(node: fx.Node, banned: dict[fx.Node, str], solution: Any) -> str:
    policy = node.meta.get("recompute")
    if policy == CheckpointPolicy.MUST_SAVE:
        return "MUST_SAVE annotation"
    if is_primal(node):
        return "input: already alive, saving costs no new memory"
    if node in banned:
        return f"banned: {banned[node]}"
    if policy == CheckpointPolicy.PREFER_SAVE:
        return "PREFER_SAVE annotation"
    if solution is None:
        return "memory budget: chosen by the knapsack"
    return "cut: cheapest place to cut"


def _recomputed_reason(node: fx.Node) -> str:
    policy = node.meta.get("recompute")
    if policy in (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE):
        return f"{policy.name} annotation"
    return "recomputed: cheaper to recompute from saved values than to save"


def _decision(node: fx.Node, decision: str, reason: str) -> NodeDecision:
    try:
        nbytes = node_nbytes(node)
    except Exception:  # sizing is informative only here
        nbytes = 0
    return NodeDecision(node.name, str(node.target), nbytes, decision, reason)


def build_report(saved_values: list[fx.Node], saved_sym_nodes: list[fx.Node],
                 bw_module: fx.GraphModule, node_info: NodeInfo,
                 solution: MinCutSolution | None, memory_budget: float) -> PartitionReport:
    banned = solution.banned if solution is not None else {}
    saved = [_decision(n, SAVED, _saved_reason(n, banned, solution))
             for n in [*saved_values, *saved_sym_nodes]]
    forward_by_name = {n.name: n for n in node_info.required_fw}
    recomputed = [
        _decision(forward_by_name[n.name], RECOMPUTED, _recomputed_reason(forward_by_name[n.name]))
        for n in bw_module.graph.nodes
        if n.op == "call_function" and n.name in forward_by_name
    ]
    saved_bytes = sum(node_nbytes(n) for n in saved_values
                      if isinstance(n.meta.get("val"), torch.Tensor))
    return PartitionReport(
        saved=saved,
        recomputed=recomputed,
        banned={n.name: why for n, why in banned.items()},
        memory_budget=memory_budget,
        saved_bytes=saved_bytes,
        solver=solution.solver if solution is not None else "inputs only",
    )


def log_report(report: PartitionReport) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return
    for d in report.saved:
        log.debug("saved %s (%s, %d bytes): %s", d.name, d.op, d.nbytes, d.reason)
    for d in report.recomputed:
        log.debug("recomputed %s (%s, %d bytes): %s", d.name, d.op, d.nbytes, d.reason)
    for name, why in report.banned.items():
        log.debug("banned %s: %s", name, why)


def explain_partition(joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                      memory_budget: float | None = None,
                      static_lifetime_input_indices: list[int] | None = None
                      ) -> PartitionReport:
    """Run the min-cut partitioner on a copy of ``joint_module`` and say what it decided.

    ``memory_budget`` overrides the ``activation_memory_budget`` flag (0 <= budget <= 1).
    """
    from .partitioners import partition_with_report

    if memory_budget is not None and not 0.0 <= memory_budget <= 1.0:
        raise ValueError(f"memory_budget must be between 0 and 1, got {memory_budget}")
    _, _, report = partition_with_report(
        copy.deepcopy(joint_module), num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_indices=static_lifetime_input_indices,
        memory_budget=memory_budget)
    return report
