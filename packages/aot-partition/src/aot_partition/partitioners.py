"""The two partition functions; each only composes the steps of the other modules.

Both have torch's ``partition_fn`` signature, so either drops into ``aot_function``,
``aot_module``, ``aot_module_simplified`` and ``torch._dynamo.backends.common.aot_autograd``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node

from ._compat import make_graph_module
from .classify import (
    NodeInfo,
    ancestors_within,
    check_topological_order,
    classify,
    forward_and_backward_outputs,
    is_fwd_seed_offset,
    is_primal,
)
from .extract import (
    extract_forward_backward,
    extract_forward_backward_graphs,
    extract_subgraph,
)
from .flags import read_flag
from .passes import (
    cleanup_recompute_tags,
    has_recomputable_ops,
    replay_random_ops,
    save_readers_of_mutated_inputs,
)
from .passes.cse import merge_common_subexpressions
from .passes.dce import eliminate_dead_code_in_graph
from .passes.reorder import reorder_backward_graph
from .policy import MinCutOptions
from .report import PartitionReport, build_report, log_report
from .sizes import node_nbytes
from .solve import MinCutSolution, solve_min_cut, solve_min_cut_detailed

log = logging.getLogger(__name__)

__all__ = [
    "default_partition",
    "min_cut_rematerialization_partition",
    "partition_with_report",
    "solve_min_cut",
]


def _is_assert_only_symbool(node: fx.Node) -> bool:
    return (isinstance(node.meta.get("val"), torch.SymBool) and len(node.users) > 0
            and all(u.target is torch.ops.aten._assert_scalar.default for u in node.users))


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
    Graphs with checkpoint recompute annotations go to the min-cut partitioner instead.
    ``static_lifetime_input_nodes`` is accepted for torch compatibility (torch's own callers
    pass it); the split does not depend on it.
    """
    if has_recomputable_ops(joint_module):
        return min_cut_rematerialization_partition(
            joint_module, _joint_inputs, num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static_lifetime_input_indices)
    graph = joint_module.graph
    check_topological_order(graph)
    inputs = [n for n in graph.nodes if is_primal(n) or is_fwd_seed_offset(n)]
    fw_outputs, _, _, _ = forward_and_backward_outputs(joint_module, num_fwd_outputs)
    forward_only = extract_subgraph(graph, inputs, fw_outputs)
    forward_names = {n.name for n in forward_only.nodes if n.op != "output"}
    saved_values: list[fx.Node] = []
    saved_sym_nodes: list[fx.Node] = []
    for node in graph.nodes:
        if node.name not in forward_names:
            continue
        if is_sym_node(node):
            # Symbolic scalars are kept apart: autograd stashes them on ctx, not via save.
            saved_sym_nodes.append(node)
        elif node.users and all(u.target is operator.getitem for u in node.users):
            # A tuple cannot be saved: save its items (dead-code elimination of the forward
            # may have dropped the ones only the backward reads).
            saved_values.extend(node.users)
        else:
            backward_uses = [u for u in node.users if u.name not in forward_names]
            if backward_uses and all(is_sym_node(u) for u in backward_uses):
                # The backward needs only sizes: save those, not the tensor.
                saved_sym_nodes.extend(backward_uses)
            elif backward_uses:
                saved_values.append(node)
    saved_values = list(dict.fromkeys(saved_values))
    saved_sym_nodes = [n for n in dict.fromkeys(saved_sym_nodes) if not _is_assert_only_symbool(n)]
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


@contextlib.contextmanager
def prepared_joint(joint_module: fx.GraphModule, num_fwd_outputs: int
                    ) -> Iterator[fx.GraphModule]:
    """The joint with dead code dropped and common subexpressions merged while partitioning.

    The merge is undone on the way out, so the caller's module keeps the graph its code was
    generated from; torch instead regenerates the joint's code, costly on big graphs when
    the module is not lazy (a direct aot_function call). Dead code is rare in traced joints
    and stays dropped (one code generation then).
    """
    check_topological_order(joint_module.graph)
    if eliminate_dead_code_in_graph(joint_module.graph):
        joint_module.recompile()
    merged = None
    if read_flag("cse"):
        # A forward-only value merged with its backward twin would become one more saved
        # value (torch 2.15 fixed this the same way): keep the two sides apart.
        _, bw_outputs, _, _ = forward_and_backward_outputs(joint_module, num_fwd_outputs)
        needed_by_backward = ancestors_within(bw_outputs, set(joint_module.graph.nodes))
        merged = merge_common_subexpressions(joint_module.graph, needed_by_backward.__contains__)
    try:
        save_readers_of_mutated_inputs(joint_module)
        yield joint_module
    finally:
        if merged is not None:
            merged.undo()


def _memory_budget(joint_graph: fx.Graph, override: float | None) -> float:
    if override is not None:
        return float(override)
    for node in joint_graph.nodes:  # a MemoryBudgetMode marker in the graph wins over the flag
        if isinstance(node.meta.get("memory_budget"), float):
            return node.meta["memory_budget"]
    return float(read_flag("activation_memory_budget"))


def _choose_saved_values(joint_graph: fx.Graph, node_info: NodeInfo, budget: float
                         ) -> tuple[list[fx.Node], MinCutSolution | None]:
    if budget == 1.0:
        solution = solve_min_cut_detailed(joint_graph, node_info, MinCutOptions.from_flags())
        return solution.saved_values, solution
    from .budget import choose_saved_values_with_solution

    saved, solution, budget_solver = choose_saved_values_with_solution(joint_graph, node_info,
                                                                       budget)
    if solution is not None:  # say both solvers in the report: e.g. "scipy min-cut, dp budget"
        solution = dataclasses.replace(
            solution, solver=f"{solution.solver} min-cut, {budget_solver} budget")
    return list(saved), solution


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
    if has_recomputable_ops(joint_module):
        cleanup_recompute_tags(joint_module)
    joint_graph = joint_module.graph
    node_info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
    budget = _memory_budget(joint_graph, memory_budget)
    if not node_info.required_bw:
        # Nothing needs a backward: the default split is exact and the network would be empty.
        fw_module, bw_module = default_partition(joint_module, None,
                                                 num_fwd_outputs=num_fwd_outputs)
        return fw_module, bw_module, PartitionReport([], [], {}, budget, 0, "none")
    chosen, solution = _choose_saved_values(joint_graph, node_info, budget)
    saved_sym_nodes = [n for n in chosen if is_sym_node(n) and not _is_assert_only_symbool(n)]
    saved_values = [n for n in chosen if not is_sym_node(n)]
    fw_graph, bw_graph, saved_values, saved_sym_nodes = extract_forward_backward_graphs(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
    # Recompute must be a pure replay: every random op run again in the backward replays the
    # forward's RNG state, whatever made it recomputed.
    replayed = replay_random_ops(fw_graph, bw_graph, len(saved_sym_nodes))
    reorder_backward_graph(bw_graph)  # before wrapping: one code generation per module
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

