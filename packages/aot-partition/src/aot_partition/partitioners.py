"""The two partition functions and ``explain_partition``; each only composes the lower steps.

Both partitioners have torch's ``partition_fn`` signature, so either drops into
``aot_function``, ``aot_module``, ``aot_module_simplified`` and
``torch._dynamo.backends.common.aot_autograd``. Neither calls the other: both are built from
``extract.default_saved_values`` (the default split) and ``partition_with_report`` (the
min-cut partition), and the min-cut partition uses the default split when nothing needs a
backward.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node

from ._compat import make_graph_module
from .budget import BudgetSearch, validate_memory_budget
from .classify import NodeInfo, classify
from .extract import (
    default_saved_values,
    extract_forward_backward,
    extract_forward_backward_graphs,
    is_assert_only_symbool,
)
from .flags import read_flag
from .pareto import sweep, write_pareto_png
from .passes import has_recomputable_ops, reorder_backward, replay_random_ops
from .policy import MinCutOptions
from .prepare import prepared_joint
from .report import PartitionReport, build_report, log_report
from .sizes import node_nbytes
from .solve import MinCutSolution, solve_min_cut, solve_min_cut_detailed

log = logging.getLogger(__name__)

__all__ = [
    "default_partition",
    "explain_partition",
    "min_cut_rematerialization_partition",
    "partition_with_report",
    "solve_min_cut",
]


def default_partition(
    joint_module: fx.GraphModule,
    _joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    static_lifetime_input_nodes: Any = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Split like the original ``.forward()``/``.backward()``: save what the backward reads.

    The forward holds every op between the forward inputs and the forward outputs; forward
    values the backward uses are saved (only sizes, when the backward needs only those).
    Graphs with checkpoint recompute annotations get the min-cut partition instead, as in
    torch. ``static_lifetime_input_nodes`` is accepted for torch compatibility (torch's own
    callers pass it); the split does not depend on it.
    """
    if has_recomputable_ops(joint_module.graph):
        fw_module, bw_module, _ = partition_with_report(
            joint_module, num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static_lifetime_input_indices)
        return fw_module, bw_module
    saved_values, saved_sym_nodes = default_saved_values(joint_module, num_fwd_outputs)
    fw_module, bw_module, _, _ = extract_forward_backward(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
    return fw_module, bw_module


def min_cut_rematerialization_partition(
    joint_module: fx.GraphModule,
    _joint_inputs: Any,
    compiler: str = "inductor",
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Save the cheapest set of values; the backward recomputes the rest from them.

    The choice is a minimum cut of the joint graph (see network.py); ban heuristics, checkpoint
    annotations and ``activation_memory_budget`` (flags in ``aot_config.functorch``) shape it.
    ``compiler`` is accepted for torch compatibility; the inductor op lists are always used.
    """
    fw_module, bw_module, _ = partition_with_report(
        joint_module, num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_indices=static_lifetime_input_indices)
    return fw_module, bw_module


def explain_partition(joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                      memory_budget: float | None = None,
                      static_lifetime_input_indices: list[int] | None = None
                      ) -> PartitionReport:
    """Run the min-cut partitioner on a copy of ``joint_module`` and say what it decided.

    ``memory_budget`` overrides the ``activation_memory_budget`` flag (0 <= budget <= 1).
    """
    if memory_budget is not None:
        validate_memory_budget(memory_budget)
    _, _, report = partition_with_report(
        copy.deepcopy(joint_module), num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_indices=static_lifetime_input_indices,
        memory_budget=memory_budget)
    return report


def _memory_budget(joint_graph: fx.Graph, override: float | None) -> float:
    if override is not None:
        return validate_memory_budget(override)
    for node in joint_graph.nodes:  # a MemoryBudgetMode marker in the graph wins over the flag
        if isinstance(node.meta.get("memory_budget"), float):
            return validate_memory_budget(node.meta["memory_budget"])
    return validate_memory_budget(read_flag("activation_memory_budget"))


def _choose_saved_values(joint_graph: fx.Graph, node_info: NodeInfo, budget: float
                         ) -> tuple[list[fx.Node], MinCutSolution | None]:
    if budget == 1.0:
        solution = solve_min_cut_detailed(joint_graph, node_info, MinCutOptions.from_flags())
        return solution.saved_values, solution
    search = BudgetSearch.prepare(joint_graph, node_info)
    saved, runtime = search.saved_values(budget)
    if read_flag("visualize_memory_budget_pareto"):
        write_pareto_png(sweep(search), search.solver)
    log.info("memory budget %.3f (%s): memory ratio %.3f, recompute runtime %.4g",
             budget, search.solver, search.memory_ratio(saved), runtime)
    found = search.solution_for(saved)
    if found is not None:  # say both solvers in the report: e.g. "scipy min-cut, dp budget"
        found = dataclasses.replace(found, solver=f"{found.solver} min-cut, {search.solver} budget")
    return list(saved), found


def partition_with_report(
    joint_module: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    memory_budget: float | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule, PartitionReport]:
    """The min-cut partition plus a PartitionReport saying why each value was saved or not."""
    with prepared_joint(joint_module, num_fwd_outputs):
        return _partition_prepared(joint_module, num_fwd_outputs, static_lifetime_input_indices,
                                   memory_budget)


def _partition_prepared(joint_module: fx.GraphModule, num_fwd_outputs: int,
                        static_lifetime_input_indices: Sequence[int] | None,
                        memory_budget: float | None
                        ) -> tuple[fx.GraphModule, fx.GraphModule, PartitionReport]:
    joint_graph = joint_module.graph
    node_info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
    budget = _memory_budget(joint_graph, memory_budget)
    if not node_info.required_bw:
        # Nothing needs a backward: the default split is exact and the network would be empty.
        saved_values, saved_sym_nodes = default_saved_values(joint_module, num_fwd_outputs)
        fw_module, bw_module, _, _ = extract_forward_backward(
            joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
        return fw_module, bw_module, PartitionReport([], [], {}, budget, 0, "none")
    chosen, solution = _choose_saved_values(joint_graph, node_info, budget)
    saved_sym_nodes = [n for n in chosen if is_sym_node(n) and not is_assert_only_symbool(n)]
    saved_values = [n for n in chosen if not is_sym_node(n)]
    fw_graph, bw_graph, saved_values, saved_sym_nodes = extract_forward_backward_graphs(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
    # Recompute must be a pure replay: every random op run again in the backward replays the
    # forward's RNG state, whatever made it recomputed.
    replayed = replay_random_ops(fw_graph, bw_graph, len(saved_sym_nodes))
    reorder_backward(bw_graph)  # before wrapping: one code generation per module
    fw_module = make_graph_module(joint_module, fw_graph)
    bw_module = make_graph_module(joint_module, bw_graph)
    report = build_report(saved_values, saved_sym_nodes, bw_module, node_info, solution, budget,
                          replayed)
    log_report(report)
    if read_flag("debug_partitioner"):
        _print_debug_summary(saved_values, fw_module, bw_module)
    return fw_module, bw_module, report


def _print_debug_summary(saved_values: list[fx.Node], fw_module: fx.GraphModule,
                         bw_module: fx.GraphModule) -> None:
    sizes = sorted((node_nbytes(n), n.name) for n in saved_values)
    print("Theoretical Activations Stored: ", sum(s for s, _ in sizes) / 1e9)
    print("Per activation: ", sizes)
    fw_ops = {n.name for n in fw_module.graph.nodes if n.op == "call_function"}
    bw_ops = {n.name for n in bw_module.graph.nodes if n.op == "call_function"}
    remat = fw_ops & bw_ops
    print(f"# remat/fw/bw: {len(remat)}/{len(fw_ops)}/{len(bw_ops)}")
