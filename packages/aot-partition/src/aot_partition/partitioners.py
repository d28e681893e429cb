"""The two partition functions and ``explain_partition``; each only composes the lower steps.

Both partitioners have torch's ``partition_fn`` signature, so either drops into
``aot_function``, ``aot_module``, ``aot_module_simplified`` and
``torch._dynamo.backends.common.aot_autograd``. Neither calls the other: both are built from
``extract.default_saved_values`` (the default split) and ``partition_with_report`` (the
min-cut partition), and the min-cut partition uses the default split when nothing needs a
backward.
"""

from __future__ import annotations

from . import _fx_extra  # noqa: F401 - first: without torch, an error naming the extra

# isort: split

import copy
import dataclasses
import gc
import importlib
import importlib.util
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch.fx as fx

from .budget.candidates import activation_bytes
from .budget.caps import (
    Cap,
    byte_cap,
    peak_cap,
    validate_memory_budget_bytes,
    validate_peak_bytes,
    within_caps,
)
from .budget.peak import SimulatedPeak
from .budget.reference import ReferenceCheck, check_against_reference
from .budget.regions import RegionOutcome, choose_with_regions
from .budget.search import BudgetSearch, validate_memory_budget
from .config import PartitionConfig
from .costs import spmd
from .costs.estimators import measure_profile, profile_key
from .errors import UnreachableMemoryBudgetError
from .fx.checkpoint_split import split_tagged_joint
from .fx.classify import NodeInfo, classify
from .fx.cut import extract_cut, finish_cut
from .fx.extract import (
    default_saved_values,
    extract_forward_backward,
    extract_forward_backward_graphs,
)
from .fx.graph_modules import make_graph_module
from .fx.offload import OffloadedValue, choose_offloads, offload_saved_values
from .fx.passes import has_recomputable_ops
from .fx.policy import MinCutOptions, active_rule_names
from .fx.prepare import prepared_joint
from .fx.regions import Regions, find_regions
from .fx.sizes import node_nbytes, saved_activation_bytes, saved_bytes, saved_bytes_expr
from .fx.solve import MinCutSolution, solve_min_cut, solve_min_cut_detailed
from .memory_models.inductor import hinted_sizes
from .memory_models.pricing import resolve_memory_model
from .memory_models.shape_guards import guard_at_most, symbolic_shape_env
from .report.pareto import ParetoPoint, sweep, write_pareto_png
from .report.report import (
    NodeDecision,
    PartitionReport,
    build_report,
    default_partition_report,
    given_budget,
    log_report,
)
from .report.trace import trace_partition, tracing

log = logging.getLogger(__name__)

__all__ = [
    "MemoryBudgetBestEffortWarning",
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
    config: PartitionConfig | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Split like the original ``.forward()``/``.backward()``: save what the backward reads.

    The forward holds every op between the forward inputs and the forward outputs; forward
    values the backward uses are saved (only sizes, when the backward needs only those).
    Graphs with checkpoint recompute annotations are split as torch's default partition
    splits them (checkpoint_split.py): tagged values are recomputed, MUST_SAVE ones and the
    regions' inputs saved; a joint that is not functional gets the min-cut partition, as in
    torch. ``static_lifetime_input_nodes`` is accepted for torch compatibility (torch's own
    callers pass it); the split does not depend on it. ``config``: the call's settings
    (default: the flags, read once now).
    """
    config = config if config is not None else PartitionConfig.from_flags()
    if has_recomputable_ops(joint_module.graph):
        cut = split_tagged_joint(joint_module, num_fwd_outputs)
        if cut is None:
            fw_module, bw_module, _ = _partition(
                joint_module, num_fwd_outputs, static_lifetime_input_indices, None, config,
                want_report=False)
            return fw_module, bw_module
        offload_cut(joint_module.graph, cut.fw, cut.bw, cut.saved_values, num_fwd_outputs,
                    config)
        return (make_graph_module(joint_module, cut.fw, code_on_first_use=config.lazy_modules),
                make_graph_module(joint_module, cut.bw, code_on_first_use=config.lazy_modules))
    saved_values, saved_sym_nodes = default_saved_values(joint_module, num_fwd_outputs)
    fw_graph, bw_graph, saved_values, saved_sym_nodes = extract_forward_backward_graphs(
        joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
    offload_cut(joint_module.graph, fw_graph, bw_graph, saved_values, num_fwd_outputs, config)
    fw_module = make_graph_module(joint_module, fw_graph, code_on_first_use=config.lazy_modules)
    bw_module = make_graph_module(joint_module, bw_graph, code_on_first_use=config.lazy_modules)
    trace_partition("default_partition",
                    lambda: default_partition_report(saved_values, saved_sym_nodes, config,
                                                     fw_module, num_fwd_outputs))
    return fw_module, bw_module


def min_cut_rematerialization_partition(
    joint_module: fx.GraphModule,
    _joint_inputs: Any,
    compiler: str = "inductor",
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    config: PartitionConfig | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Save the cheapest set of values; the backward recomputes the rest from them.

    The choice is a minimum cut of the joint graph (see network.py); ban heuristics, checkpoint
    annotations and the activation memory budget shape it. ``config``: the call's settings
    (default: the flags of ``aot_config.functorch``, read once now). ``compiler`` is accepted
    for torch compatibility; the inductor op lists are always used.
    """
    fw_module, bw_module, _ = _partition(
        joint_module, num_fwd_outputs, static_lifetime_input_indices, None,
        call_config(config), want_report=False)
    return fw_module, bw_module


def explain_partition(joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                      memory_budget: float | None = None,
                      static_lifetime_input_indices: list[int] | None = None,
                      memory_budget_bytes: int | None = None,
                      peak_bytes: int | None = None,
                      config: PartitionConfig | None = None) -> PartitionReport:
    """Run the min-cut partitioner on a copy of ``joint_module`` and say what it decided.

    ``memory_budget`` overrides the config's fraction (0 <= budget <= 1), ``memory_budget_bytes``
    its cap on saved activation bytes and ``peak_bytes`` its cap on the simulated peak (the
    caps win over any fraction; both hold when both are set).
    """
    if memory_budget is not None:
        validate_memory_budget(memory_budget)
    _, _, report = partition_with_report(
        copy.deepcopy(joint_module), num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_indices=static_lifetime_input_indices,
        memory_budget=memory_budget, memory_budget_bytes=memory_budget_bytes,
        peak_bytes=peak_bytes, config=config)
    return report


def call_config(config: PartitionConfig | None, memory_budget_bytes: int | None = None,
                peak_bytes: int | None = None) -> PartitionConfig:
    """The one config of a partition call: ``config``, or the flags read now, with the byte
    caps given as arguments on top (each checked)."""
    config = config if config is not None else PartitionConfig.from_flags()
    if memory_budget_bytes is not None:
        config = config.replace(memory_budget_bytes=memory_budget_bytes)
    if peak_bytes is not None:
        config = config.replace(peak_bytes=peak_bytes)
    if config.memory_budget_bytes is not None:
        validate_memory_budget_bytes(config.memory_budget_bytes)
    if config.peak_bytes is not None:
        validate_peak_bytes(config.peak_bytes)
    return config


def _memory_budget(joint_graph: fx.Graph, override: float | None,
                   config: PartitionConfig, regions: Regions) -> tuple[float, str | None]:
    """The global budget and where it came from (None: the call or the config): ``override``,
    else a region over the whole forward (torch's case), else a MemoryBudgetMode marker in the
    graph, else the config's (torch's precedence)."""
    if override is not None:
        return validate_memory_budget(override), None
    whole = regions.whole_forward_fraction()
    if whole is not None:
        return validate_memory_budget(whole), "a region over the whole forward"
    for node in joint_graph.nodes:  # a MemoryBudgetMode marker in the graph wins over config
        if isinstance(node.meta.get("memory_budget"), float):
            return validate_memory_budget(node.meta["memory_budget"]), "a MemoryBudgetMode marker"
    return validate_memory_budget(config.memory_budget), None


@dataclasses.dataclass
class _Choice:
    """What the budget step chose, for the report."""

    saved: list[fx.Node]
    solution: MinCutSolution | None
    options: MinCutOptions                 # the options of the cut that chose ``saved``
    activation_bytes: int | None = None    # set under a byte budget (caps.activation_bytes)
    simulated_peak: int | None = None      # set under a peak cap (caps.SimulatedPeak)
    peak_limit: int | None = None          # the peak cap in bytes it was held to
    memory_model: str | None = None        # the model that priced the peak (memory_models/pricing.py)
    reference_check: ReferenceCheck | None = None  # set at a fraction (reference.py)
    label: str | None = None               # the report's solver when no min cut chose ``saved``
    pareto_points: tuple[ParetoPoint, ...] = ()  # swept under the visualize flag
    pareto_png: str | None = None
    regions: list[RegionOutcome] = dataclasses.field(default_factory=list)  # region budgets
    # Backward live sets the choice found (BudgetSearch.backward_live), for extraction.
    backward_live: dict[frozenset[fx.Node], set[fx.Node]] = dataclasses.field(
        default_factory=dict)


def _labelled(search: BudgetSearch, saved: list[fx.Node], how: str) -> MinCutSolution | None:
    found = search.solution_for(saved)
    if found is not None:  # say both solvers in the report: e.g. "scipy min-cut, dp budget"
        found = dataclasses.replace(found, solver=f"{found.solver} min-cut, {how}")
    return found


def _options_for(search: BudgetSearch, saved: list[fx.Node]) -> MinCutOptions:
    return search.options_of.get(frozenset(saved), search.options)


def has_peak_cap(config: PartitionConfig) -> bool:
    """Whether the call caps the modelled peak (in bytes, or as a fraction of the
    runtime-optimal cut's peak)."""
    return config.peak_bytes is not None or config.peak_fraction is not None


def _peak_limit(search: BudgetSearch, config: PartitionConfig, peak: SimulatedPeak) -> int:
    """The peak cap in bytes: ``peak_bytes``, and ``peak_fraction`` of the runtime-optimal
    cut's modelled peak (the lower when both are set)."""
    limits = [] if config.peak_bytes is None else [config.peak_bytes]
    if config.peak_fraction is not None:
        top = peak.of(search.runtime_optimal).peak_bytes
        limits.append(int(config.peak_fraction * top))
    return min(limits)


def _caps(search: BudgetSearch, config: PartitionConfig, peak: SimulatedPeak | None
          ) -> list[Cap]:
    """The call's caps, the cheap byte cap first (it filters what the simulator measures)."""
    caps = []
    if config.memory_budget_bytes is not None:
        caps.append(byte_cap(search, config.memory_budget_bytes))
    if has_peak_cap(config):
        assert peak is not None
        caps.append(peak_cap(_peak_limit(search, config, peak), peak,
                             after_byte_cap=bool(caps), search=search))
    return caps


def _cap_words(config: PartitionConfig) -> str:
    """The caps in the report's words (``GivenBudget.describe``)."""
    return given_budget(config.memory_budget, saved_bytes_cap=config.memory_budget_bytes,
                        peak_cap=config.peak_bytes,
                        peak_fraction=config.peak_fraction).describe()


class MemoryBudgetBestEffortWarning(UserWarning):
    """A byte cap was unreachable and ``activation_memory_budget_best_effort`` took the cut
    closest to it; the message says the cap, what was saved instead and by which cut."""


def _within_caps_best_effort(search: BudgetSearch, caps: list[Cap]) -> Any:
    """``within_caps``; each cap that nothing meets is raised to the least its measure reaches
    (the error carries it), once per cap, with a warning saying so."""
    for _ in range(len(caps) + 1):
        try:
            return within_caps(search, caps)
        except UnreachableMemoryBudgetError as error:
            failing = next(i for i, cap in enumerate(caps)
                           if (cap.what, cap.limit) == (error.what, error.cap))
            caps[failing] = dataclasses.replace(caps[failing], limit=error.least)
            message = (f"{error}; best effort (activation_memory_budget_best_effort): took the "
                       f"{error.least_label} cut at {error.least} bytes")
            log.info("%s", message)
            warnings.warn(message, MemoryBudgetBestEffortWarning, stacklevel=2)
    raise AssertionError("best effort: a cap raised to its least reachable measure still fails")


def _choose_under_caps(search: BudgetSearch, config: PartitionConfig,
                       peak: SimulatedPeak | None) -> _Choice:
    caps = _caps(search, config, peak)
    chosen = (_within_caps_best_effort(search, caps) if config.best_effort
              else within_caps(search, caps))
    _guard_every_shape(search, config, caps, chosen, peak)
    saved = list(chosen.saved)
    nbytes = activation_bytes(search, chosen)
    measured = peak.of(chosen.saved) if peak is not None else None  # cached: measured choosing
    simulated = measured.peak_bytes if measured is not None else None
    log.info("memory caps (%s): chose %s, %d activation bytes, %s peak %s, recompute "
             "runtime %.4g", _cap_words(config), chosen.label, nbytes,
             measured.model if measured is not None else "no", simulated, chosen.runtime)
    solution = _labelled(search, saved, f"{chosen.label} cut under {_cap_words(config)}")
    return _Choice(saved, solution, _options_for(search, saved), nbytes, simulated,
                   peak_limit=caps[-1].limit if peak is not None else None,
                   memory_model=measured.model if measured is not None else None)


def _guard_every_shape(search: BudgetSearch, config: PartitionConfig, caps: list[Cap],
                       chosen: Any, peak: SimulatedPeak | None) -> None:
    """Under dynamic shapes, make the caps hold at every shape that runs: what each cap
    measures of the chosen cut, as expressions of the shape symbols, guarded to stay within it
    (memory_models/shape_guards.py: a shape that would break it compiles again and is planned for)."""
    shape_env = symbolic_shape_env(search.joint_graph)
    if shape_env is None:
        return
    if config.memory_budget_bytes is not None:
        states = activation_bytes(search, chosen) - saved_bytes(chosen.read)  # RNG states
        guard_at_most(shape_env, [saved_bytes_expr(chosen.read) + states], caps[0].limit,
                      "activation memory budget")
    if peak is None:
        return
    expressions = peak.of(chosen.saved).peak_expressions
    if config.peak_bytes is not None:
        guard_at_most(shape_env, expressions, caps[-1].limit, "memory peak cap")
    if config.peak_fraction is not None:
        # A fraction of the runtime-optimal cut's peak, at every shape: within that share of
        # its expression that is the largest at the traced shapes (its peak is at least that).
        top = peak.of(search.runtime_optimal)
        hint = hinted_sizes(shape_env)
        largest = max(top.peak_expressions, key=hint, default=top.peak_bytes)
        guard_at_most(shape_env, [e - config.peak_fraction * largest for e in expressions], 0,
                      "memory peak cap (fraction)")


def _choose_with_regions(joint_graph: fx.Graph, node_info: NodeInfo, budget: float,
                         config: PartitionConfig, regions: Regions) -> _Choice:
    if config.memory_budget_bytes is not None or has_peak_cap(config):
        raise ValueError(
            "region memory budgets (several, or not over the whole forward) cannot be combined "
            "with a global byte cap (activation_memory_budget_bytes="
            f"{config.memory_budget_bytes}, activation_memory_peak_bytes={config.peak_bytes}); "
            "give the rest of the graph a fraction, or put it in a region with a byte cap")
    search = BudgetSearch.prepare(joint_graph, node_info, config=config)
    saved, runtime, outcomes = choose_with_regions(search, regions, budget)
    log.info("region budgets (%d regions): recompute runtime %.4g", len(regions.nodes), runtime)
    solution = _labelled(search, saved, "region budgets")
    return _Choice(saved, solution, _options_for(search, saved), regions=outcomes,
                   label=None if solution is not None else "region budgets")


def _choose_saved_values(joint_graph: fx.Graph, node_info: NodeInfo, budget: float,
                         config: PartitionConfig, peak: SimulatedPeak | None,
                         simulator: Callable[[str], SimulatedPeak],
                         regions: Regions | None = None) -> _Choice:
    """``peak``: the measure of the peak cap, if one is set; ``simulator(estimator)``: a
    simulator of this joint's cuts for the reference check (reference.py); ``regions``: the
    joint's region budgets, solved together unless one covers the whole forward (then
    ``budget`` is its fraction, as in torch)."""
    if regions is not None and regions.nodes and regions.whole_forward_fraction() is None:
        return _choose_with_regions(joint_graph, node_info, budget, config, regions)
    if config.memory_budget_bytes is not None or has_peak_cap(config):
        search = BudgetSearch.prepare(joint_graph, node_info, config=config)
        return _choose_under_caps(search, config, peak)
    if budget == 1.0:
        solution = solve_min_cut_detailed(joint_graph, node_info, config.options, config=config)
        return _Choice(solution.saved_values, solution, config.options)
    search = BudgetSearch.prepare(joint_graph, node_info, config=config)
    # torch's case, one region over the whole forward: at 0.0 the region is checkpointed whole.
    search.inputs_alive = regions is not None and regions.whole_forward_fraction() == budget
    if budget == 0.0:  # no estimate decides at 0 (no knapsack, no reference check)
        saved, check = search.least_memory_values(), None
        runtime = float(sum(search.item_runtimes())) if log.isEnabledFor(logging.INFO) else 0.0
    elif config.reference_estimator is None:
        saved, runtime = search.saved_values(budget)
        check = None
    else:
        saved, runtime, check = check_against_reference(
            search, budget, config.reference_estimator, simulator(search.estimator))
    pareto_points: tuple[ParetoPoint, ...] = ()
    pareto_png = None
    if config.visualize_pareto:
        pareto_points = tuple(sweep(search))
        pareto_png = write_pareto_png(list(pareto_points), search.solver, config.pareto_dir)
    log.info("memory budget %.3f (%s): memory ratio %.3f, recompute runtime %.4g",
             budget, search.solver, search.memory_ratio(saved), runtime)
    saved = list(saved)
    how = f"{search.solver} budget"
    if check is not None and not check.kept_ours:
        how += f", the {check.chosen} cut (reference check)"
    chosen_by = _labelled(search, saved, how)
    # The "ilp_graph" solver returns a saved set without a min cut: say so, not "inputs only".
    label = (f"whole-graph MILP, {how}"
             if chosen_by is None and frozenset(saved) != frozenset(node_info.inputs) else None)
    return _Choice(saved, chosen_by, _options_for(search, saved), reference_check=check,
                   label=label, pareto_points=pareto_points, pareto_png=pareto_png,
                   backward_live=search.backward_live)


def partition_with_report(
    joint_module: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    memory_budget: float | None = None,
    memory_budget_bytes: int | None = None,
    peak_bytes: int | None = None,
    config: PartitionConfig | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule, PartitionReport]:
    """The min-cut partition plus a PartitionReport saying why each value was saved or not.

    Every decision is a function of the joint graph and one ``PartitionConfig``: ``config``,
    or the flags read once here. ``memory_budget``, ``memory_budget_bytes`` and ``peak_bytes``
    override its fraction, its byte cap and its cap on the simulated peak.
    """
    config = call_config(config, memory_budget_bytes, peak_bytes)
    fw_module, bw_module, report = _partition(joint_module, num_fwd_outputs,
                                              static_lifetime_input_indices, memory_budget,
                                              config, want_report=True)
    assert report is not None
    return fw_module, bw_module, report


def _partition(joint_module: fx.GraphModule, num_fwd_outputs: int,
               static_lifetime_input_indices: Sequence[int] | None,
               memory_budget: float | None, config: PartitionConfig, *, want_report: bool
               ) -> tuple[fx.GraphModule, fx.GraphModule, PartitionReport | None]:
    """The min-cut partition; its report only when ``want_report``, tracing or debug logging
    asks for it (building it reads every saved and recomputed node: 2-6 ms on a
    1,000-node joint, which a compile that discards it should not pay)."""
    with _gc_paused(), prepared_joint(joint_module, num_fwd_outputs, config=config):
        fw_module, bw_module, make_report = _partition_prepared(
            joint_module, num_fwd_outputs, static_lifetime_input_indices, memory_budget, config)
        report = (make_report() if want_report or tracing() or log.isEnabledFor(logging.DEBUG)
                  else None)
        # make_report holds the partition's working data (classification, description,
        # networks, cuts): freed now, while the collector is off, since the first collection
        # after it is back on walks every object the call allocated that is still alive;
        # then it walks little more than the two graphs returned.
        del make_report
    if report is not None:
        log_report(report)
        trace_partition("min_cut_rematerialization_partition", lambda: report)
    return fw_module, bw_module, report


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Automatic garbage collection off for one partition, back on (if it was) afterwards.

    A partition allocates hundreds of thousands of short-lived fx objects, which trigger full
    collections that walk the whole heap (0.6-0.7 s of a 2.3 s partition of a 15k-node joint)
    and free nothing the partition still holds; its garbage is collected after the call.
    Peak RSS measured the same with and without (967 MiB on that joint).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _partition_prepared(joint_module: fx.GraphModule, num_fwd_outputs: int,
                        static_lifetime_input_indices: Sequence[int] | None,
                        memory_budget: float | None, config: PartitionConfig
                        ) -> tuple[fx.GraphModule, fx.GraphModule,
                                   Callable[[], PartitionReport]]:
    """(forward, backward, a function building the partition's report)."""
    joint_graph = joint_module.graph
    node_info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
    regions = find_regions(joint_graph, node_info)
    budget, budget_source = _memory_budget(joint_graph, memory_budget, config, regions)
    region_labels = (() if not regions.nodes or regions.whole_forward_fraction() is not None
                     else (*(f"region {b.label}" for b in regions.nodes),
                           f"rest (global {budget:g})"))
    given = given_budget(budget, saved_bytes_cap=config.memory_budget_bytes,
                         peak_cap=config.peak_bytes, peak_fraction=config.peak_fraction,
                         regions=region_labels, source=budget_source)
    if not node_info.required_bw:
        # Nothing needs a backward: the default split is exact and the network would be empty.
        saved_values, saved_sym_nodes = default_saved_values(joint_module, num_fwd_outputs)
        fw_module, bw_module, _, _ = extract_forward_backward(
            joint_module, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs,
            lazy_modules=config.lazy_modules)
        return fw_module, bw_module, lambda: PartitionReport(
            [], [], {}, budget, saved_activation_bytes(fw_module, num_fwd_outputs), "none",
            config=config, memory_budget_bytes=config.memory_budget_bytes,
            peak_bytes=config.peak_bytes, budget=given)
    # Simulators of this joint's cuts, by estimator (nothing runs until a cut is measured).
    static = (None if static_lifetime_input_indices is None
              else tuple(static_lifetime_input_indices))
    simulators: dict[str | None, SimulatedPeak] = {}

    # A peak cap is priced by the model of the program that will run (memory_models/pricing.py); the
    # reference check at a fraction compares cuts on the eager model (cheap; no cap to hold).
    model = resolve_memory_model(config.memory_model) if has_peak_cap(config) else "eager"

    def simulator(estimator: str | None) -> SimulatedPeak:
        # One per estimator: the cut the peak cap or the reference check measured is then
        # not measured, nor extracted, again.
        if estimator not in simulators:
            simulators[estimator] = SimulatedPeak(joint_module, num_fwd_outputs, static,
                                                  estimator, model)
        return simulators[estimator]

    peak = simulator(config.runtime_estimator) if has_peak_cap(config) else None
    # Many ranks: one decision on every rank (costs/spmd.py); nothing happens on one rank.
    needs_runtimes = (budget < 1.0 or config.memory_budget_bytes is not None
                      or has_peak_cap(config))
    planner = _whole_planner(config, regions)
    planned_offloads: list[str] | None = None
    with spmd.rank_agreement(joint_graph, config, needs_runtimes=needs_runtimes,
                             measure=measure_profile, signature=profile_key):
        if planner is not None:
            choice, planned_offloads = _choose_with_planner(
                planner, joint_module, node_info, budget, config, num_fwd_outputs, static)
        else:
            choice = _choose_saved_values(joint_graph, node_info, budget, config, peak,
                                          simulator, regions)
    # The same graphs the peak cap simulated: the passes run before wrapping (one code
    # generation per module).
    cut = next((graphs for measured in simulators.values()
                if (graphs := measured.take_graphs(choice.saved)) is not None), None)
    if cut is None:  # planned already when the peak cap or reference check measured it
        plan = next((found for measured in simulators.values()
                     if (found := measured.plan(choice.saved)) is not None), None)
        cut = finish_cut(extract_cut(joint_module, choice.saved, num_fwd_outputs=num_fwd_outputs,
                                     known_live=choice.backward_live, plan=plan))
    saved_values, saved_sym_nodes = cut.saved_values, cut.saved_sym_nodes
    spmd.check_saved_agreement([*saved_values, *saved_sym_nodes], config)
    offloaded, offload_notes = offload_cut(joint_graph, cut.fw, cut.bw, saved_values,
                                           num_fwd_outputs, config, planned=planned_offloads)
    fw_module = make_graph_module(joint_module, cut.fw, code_on_first_use=config.lazy_modules)
    bw_module = make_graph_module(joint_module, cut.bw, code_on_first_use=config.lazy_modules)
    if config.debug:
        _print_debug_summary(saved_values, fw_module, bw_module)

    def make_report() -> PartitionReport:
        report = build_report(saved_values, saved_sym_nodes, fw_module, bw_module,
                              num_fwd_outputs, node_info, choice.solution, budget, cut.replayed,
                              solver=choice.label)
        report = dataclasses.replace(
            report, active_rules=active_rule_names(choice.options), config=config,
            memory_budget_bytes=config.memory_budget_bytes,
            activation_bytes=choice.activation_bytes, peak_bytes=choice.peak_limit,
            simulated_peak_bytes=choice.simulated_peak, memory_model=choice.memory_model,
            reference_check=choice.reference_check,
            pareto_points=choice.pareto_points, pareto_png=choice.pareto_png,
            regions=choice.regions, budget=given,
            offloaded=[NodeDecision(v.name, "aot_partition.offload_to_host", v.nbytes,
                                    "offloaded", v.describe()) for v in offloaded])
        report.notes.extend(offload_notes)
        if regions.whole_forward_fraction() is not None and memory_budget is None:
            report.notes.append(f"memory budget {budget:g} from a region annotation over the "
                                "whole forward (region_activation_memory_budget)")
        return report

    return fw_module, bw_module, make_report


OFFLOAD_PLANNER_MODULE = "aot_partition.budget.offload_plan"


def _planner_module() -> Any:
    """The activation planner's module (budget/offload_plan.py), None when this install has
    no planner module."""
    if importlib.util.find_spec(OFFLOAD_PLANNER_MODULE) is None:
        return None
    return importlib.import_module(OFFLOAD_PLANNER_MODULE)


def _offload_planner() -> Callable[..., Sequence[str]] | None:
    """``plan_offload(joint_graph, saved_values, config) -> saved node names``: offloads
    among a cut's fixed saved values; None when this install has no planner module."""
    module = _planner_module()
    return None if module is None else module.plan_offload


def _whole_planner(config: PartitionConfig, regions: Regions) -> Any:
    """The planner's module when it chooses the whole cut: the planner flag is on, it is
    installed and no partial region budgets apply (those keep the budget search; the planner
    then offloads among the cut's saved values only, in ``offload_cut``)."""
    if not config.offload_planner:
        return None
    if regions.nodes and regions.whole_forward_fraction() is None:
        log.info("activation_offload_planner: region budgets choose the cut; the planner only "
                 "picks offloads among its saved values")
        return None
    return _planner_module()


def _choose_with_planner(planner: Any, joint_module: fx.GraphModule, node_info: NodeInfo,
                         budget: float, config: PartitionConfig, num_fwd_outputs: int,
                         static: tuple[int, ...] | None) -> tuple[_Choice, list[str]]:
    """Keep / recompute / offload by the planner (budget/offload_plan.py) under the call's
    budget: a peak cap (``plan_under_peak``'s candidates, within any byte cap too), else a byte
    cap (``plan_within_bytes``), else the fraction (``plan_activations``). Returns the choice
    (the plan's saved set) and the names the plan offloads."""
    search = BudgetSearch.prepare(joint_module.graph, node_info, config=config)
    # Read per call: tests lower the size floor for tiny models and take fewer fractions.
    min_bytes = planner.OFFLOAD_MIN_BYTES
    simulated = None
    if config.peak_fraction is not None:
        raise ValueError(
            "activation_memory_peak_fraction is not supported with activation_offload_planner "
            f"(got {config.peak_fraction}); give the peak in bytes "
            "(activation_memory_peak_bytes, or memory_budget='20GiB peak')")
    if config.peak_bytes is not None:
        candidates = planner.peak_candidates(search, joint_module, num_fwd_outputs,
                                             static_input_indices=static, min_bytes=min_bytes,
                                             fractions=planner.PEAK_PLAN_FRACTIONS)
        nbytes = config.memory_budget_bytes
        if nbytes is not None:
            fitting = [c for c in candidates if c.plan.device_bytes <= nbytes]
            if not fitting:
                least = min(candidates, key=lambda c: c.plan.device_bytes).plan
                _unreachable_or_best_effort(config, UnreachableMemoryBudgetError(
                    "activation memory budget", nbytes, math.ceil(least.device_bytes),
                    least.label))
                fitting = [c for c in candidates
                           if c.plan.device_bytes <= math.ceil(least.device_bytes)]
            candidates = fitting
        try:
            chosen = planner.choose_under_peak(candidates, config.peak_bytes)
        except UnreachableMemoryBudgetError as error:
            _unreachable_or_best_effort(config, error)
            chosen = planner.choose_under_peak(candidates, error.least)
        plan, simulated = chosen.plan, chosen.peak_bytes
    elif config.memory_budget_bytes is not None:
        try:
            plan = planner.plan_within_bytes(search, config.memory_budget_bytes,
                                             min_bytes=min_bytes)
        except UnreachableMemoryBudgetError as error:
            if error.least < 0:
                raise
            _unreachable_or_best_effort(config, error)
            plan = planner.plan_within_bytes(search, error.least, min_bytes=min_bytes)
    else:
        plan = planner.plan_activations(search, budget, min_bytes=min_bytes)
    label = (f"offload planner, {plan.label} ({plan.source}, gap {plan.gap:.2%}): "
             f"{len(plan.kept)} kept, {len(plan.offloaded)} offloaded, "
             f"{len(plan.recomputed)} recomputed")
    log.info("%s; recompute %.4g s, exposed copies %.4g s", label, plan.recompute_s,
             plan.exposed_s)
    nbytes_kept = (int(plan.device_bytes) if config.memory_budget_bytes is not None else None)
    choice = _Choice(list(plan.saved), None, search.options, activation_bytes=nbytes_kept,
                     simulated_peak=simulated, label=label, peak_limit=config.peak_bytes,
                     memory_model="eager" if simulated is not None else None)
    return choice, [n.name for n in plan.offloaded]


def _unreachable_or_best_effort(config: PartitionConfig,
                                error: UnreachableMemoryBudgetError) -> None:
    """Raise ``error`` unless ``activation_memory_budget_best_effort`` is on; then warn that
    the least reachable measure is taken instead."""
    if not config.best_effort:
        raise error
    message = (f"{error}; best effort (activation_memory_budget_best_effort): took "
               f"{error.least_label} at {error.least} bytes")
    log.info("%s", message)
    warnings.warn(message, MemoryBudgetBestEffortWarning, stacklevel=3)


def offload_cut(joint_graph: fx.Graph, fw_graph: fx.Graph, bw_graph: fx.Graph,
                saved_values: Sequence[fx.Node], num_fwd_outputs: int, config: PartitionConfig,
                *, planned: Sequence[str] | None = None
                ) -> tuple[list[OffloadedValue], list[str]]:
    """Offload (fx/offload.py) the saved values of one cut that torch's should_offload tags
    and, with the planner flag, the planner choose; in place, before the graphs are wrapped.
    ``planned``: the offloads of the planner's whole plan (this cut's saved set came from it);
    None: ``plan_offload`` picks among ``saved_values``. Returns (what was offloaded, notes
    for the report)."""
    if not config.offloading:
        return [], []
    requested: dict[str, str] = {}
    notes: list[str] = []
    if planned is not None:
        saved_names = {n.name for n in saved_values}
        for name in planned:
            if name in saved_names:
                requested[name] = "planner"
            else:  # extraction saved something else in its place: nothing to offload
                notes.append(f"the planner's offload of '{name}' was dropped: the extracted "
                             "cut does not save it")
    elif config.offload_planner:
        plan = _offload_planner()
        if plan is None:
            message = (f"activation_offload_planner is on but {OFFLOAD_PLANNER_MODULE} is not "
                       "installed: only should_offload tags are offloaded")
            log.warning("%s", message)
            notes.append(message)
        else:
            requested = dict.fromkeys(plan(joint_graph, list(saved_values), config), "planner")
    chosen, tag_notes = choose_offloads(fw_graph, bw_graph, num_fwd_outputs, requested,
                                        honour_tags=True)
    offloaded = offload_saved_values(fw_graph, bw_graph, chosen, num_fwd_outputs=num_fwd_outputs,
                                     bandwidth_gbps=config.offload_bandwidth_gbps,
                                     pinned=config.offload_device == "cpu")
    return offloaded, notes + tag_notes


def _print_debug_summary(saved_values: list[fx.Node], fw_module: fx.GraphModule,
                         bw_module: fx.GraphModule) -> None:
    sizes = sorted((node_nbytes(n), n.name) for n in saved_values)
    # The total in the one measure (views of inputs free, an activation's views once).
    print("Theoretical Activations Stored: ", saved_bytes(saved_values) / 1e9)
    print("Per activation: ", sizes)
    fw_ops = {n.name for n in fw_module.graph.nodes if n.op == "call_function"}
    bw_ops = {n.name for n in bw_module.graph.nodes if n.op == "call_function"}
    remat = fw_ops & bw_ops
    print(f"# remat/fw/bw: {len(remat)}/{len(fw_ops)}/{len(bw_ops)}")
