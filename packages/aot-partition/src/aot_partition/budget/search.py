"""The activation-memory budget: save at most ``budget`` of the runtime-optimal activations.

The budget is a fraction between the inputs-only cut (0.0: save nothing but the inputs) and the
runtime-optimal min cut (1.0). The search follows torch's ``choose_saved_values_set``:

1. the runtime-optimal cut; done if the budget is 1.0;
2. a cut with the used-far-apart, long-fusible-chain and materialization bans lifted (the
   ``max_dist_from_bw`` ban stays, as in torch); done if it fits;
3. a cut with the allowlist ban lifted too (fully aggressive); done if it fits;
4. otherwise a knapsack over the nodes that stayed banned: those the solver chooses to keep
   saved stay banned, the rest are released, and a final cut is taken.

The solver is the flag ``activation_memory_budget_solver`` (``BUDGET_SOLVERS``, the one list of
the names): a knapsack solver of knapsack.py, "dp_graph" (the DP, then a check that accounts
for what recomputing needs; see graph_aware_knapsack) or "ilp_graph" (the whole
save-or-recompute problem as one MILP, with no more saved bytes than the "dp" answer; see
ilp_graph.py). Runtimes come from ``activation_memory_budget_runtime_estimator``. Both are
read from the call's ``PartitionConfig`` (``BudgetSearch.prepare(..., config=)``).
``validate_memory_budget`` is the one check of a budget value.

Budgets in bytes (``activation_memory_budget_bytes``, ``activation_memory_peak_bytes``) choose
among a fixed set of this search's cuts: see caps.py.

The core's search (``core.partition_under_budget``) is the other budget search; this one stays
the fx path's because its answers are torch's (ARCHITECTURE.md, "Two budget searches, and
why"). ``core_budget_graph`` translates a search's joint into the core's terms and
``core_saved_values`` runs the core's search on it: tests/aot_partition/
test_one_budget_search.py compares the two.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import is_sym_node

from ..config import PartitionConfig
from ..core.budget import BudgetedPartition, partition_under_budget
from ..core.graph import CoreGraph
from ..core.ilp_graph import SaveOrRecompute, evaluate, solve_save_or_recompute
from ..core.knapsack import KNAPSACK_SOLVERS, KnapsackResult, dp_knapsack, get_knapsack_solver
from ..core.rules import use_distances
from ..costs import spmd
from ..costs.estimators import check_estimator, estimate_runtime
from ..fx.classify import FAR_FROM_BACKWARD, NodeInfo, default_op_types
from ..fx.context import PolicyContext
from ..fx.extract import backward_live_nodes
from ..fx.joint import is_bwd_seed_offset, is_random, is_tangent
from ..fx.network import NetworkMemo, core_options
from ..fx.passes.rng import device_of, rng_state_nbytes
from ..fx.policy import MinCutOptions, never_released
from ..fx.sizes import is_opaque, node_nbytes
from ..fx.solve import MinCutSolution, min_cut_bans, selected_solver, solve_min_cut_detailed

log = logging.getLogger(__name__)

__all__ = [
    "BUDGET_SOLVERS",
    "BudgetSearch",
    "choose_saved_values_set",
    "core_budget_graph",
    "core_saved_values",
    "validate_memory_budget",
]

# Budget solvers that look at the graph, not only at the knapsack items.
GRAPH_AWARE_SOLVERS = ("dp_graph", "ilp_graph")
# Every valid ``activation_memory_budget_solver``: the knapsack solvers and the two above.
BUDGET_SOLVERS = tuple(sorted((*KNAPSACK_SOLVERS, *GRAPH_AWARE_SOLVERS)))
# Extra min-cut solves the "dp_graph" solver may spend repairing an over-budget answer.
DP_GRAPH_MAX_REPAIRS = 12


def validate_memory_budget(memory_budget: float) -> float:
    """``memory_budget`` as a float; ValueError unless it is a number in [0, 1]."""
    if not isinstance(memory_budget, (int, float)) or not 0 <= memory_budget <= 1:
        raise ValueError(f"activation memory budget must be between 0 and 1 (0 = save only the "
                         f"inputs, 1 = runtime-optimal); got {memory_budget!r}")
    return float(memory_budget)


def _budget_solver(name: str) -> str:
    if name not in BUDGET_SOLVERS:
        raise ValueError(f"Unknown memory-budget solver {name!r}; valid: "
                         f"{', '.join(BUDGET_SOLVERS)} (flag activation_memory_budget_solver)")
    return name


def _storage_key(node: fx.Node) -> object:
    """The storage a node's tensor lives in (views of an input share it), else None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not torch._C._has_storage(val):
        return None
    # The storage's address: unique while the graph's values hold their storages (a
    # StorageWeakRef per node cost more than the rest of recompute_candidates).
    return int(val.untyped_storage()._cdata)


def _activation_bytes(nodes: list[fx.Node]) -> int:
    """The fraction search's scale (torch's): each value's own bytes, inputs included. Not
    what a report says a cut saves (``sizes.saved_bytes``, the one measure): the fraction
    budget is defined on this scale, so fraction decisions stay torch's."""
    return sum(node_nbytes(n) for n in nodes)


def recompute_savings(node: fx.Node) -> int:
    """Bytes that recomputing ``node`` instead of saving it frees: its size, less the RNG
    state a random op then saves to replay its draw (0 when the state is the bigger one)."""
    nbytes = node_nbytes(node)
    if is_random(node):
        nbytes -= rng_state_nbytes(device_of(node).type)
    return max(nbytes, 0)


def recompute_candidates(node_info: NodeInfo, banned: Sequence[fx.Node],
                         options: MinCutOptions) -> tuple[list[fx.Node], list[fx.Node]]:
    """(must save, knapsack items) of ``banned``: the banned nodes near enough to the backward
    and not views of an input; those never released (``never_released``: never recomputed,
    or collectives under ``options``) must stay saved,
    the rest are items, biggest first (stable in graph order: torch's knapsack item order)."""
    input_storages = {_storage_key(n) for n in node_info.inputs}
    dist = node_info.dist_from_bw
    recomputable = [n for n in banned
                    if dist.get(n, math.inf) < FAR_FROM_BACKWARD
                    and _storage_key(n) not in input_storages and not is_opaque(n)]
    must_save = [n for n in recomputable if never_released(n, options) is not None]
    kept = set(must_save)
    # A random op whose RNG state outweighs its output frees nothing when recomputed:
    # it stays banned (saved) rather than being left to the knapsack's tie-breaking.
    savings = {n: recompute_savings(n) for n in recomputable if n not in kept}
    items = sorted((n for n, saved in savings.items() if saved > 0 or not is_random(n)),
                   key=node_nbytes, reverse=True)
    return must_save, items


def saves_inputs_only(cut: Sequence[fx.Node], inputs: Sequence[fx.Node]) -> bool:
    """Whether ``cut`` saves graph inputs only. Then the backward reads the same inputs
    from it as from all of ``inputs``: inputs have nothing to recompute them from, so a live
    node's inputs are live either way (no walk needed to see the tie)."""
    return set(cut).issubset(inputs)


def needed_by_backward(search: BudgetSearch, saved: Sequence[fx.Node]) -> list[fx.Node]:
    """The saved values the backward really reads: what extraction keeps of ``saved``.

    The budget search may list every input as saved (budget 0); inputs that no backward
    computation reaches are dropped when the graphs are extracted, so they cost nothing.
    """
    backward_inputs = [n for n in search.joint_graph.find_nodes(op="placeholder")
                       if is_tangent(n) or is_bwd_seed_offset(n)]
    inputs = [*saved, *backward_inputs]
    live = backward_live_nodes(search.joint_graph, inputs, search.node_info.bw_outputs)
    search.backward_live[frozenset(inputs)] = live  # extraction of the chosen set reuses it
    return [n for n in saved if n in live]


@dataclass
class BudgetSearch:
    """Everything the budget search computes once per joint graph; ``saved_values(b)`` per budget.

    Build it with ``BudgetSearch.prepare``; a Pareto sweep calls ``saved_values`` many times.
    """

    joint_graph: fx.Graph
    node_info: NodeInfo
    solver: str
    estimator: str
    options: MinCutOptions
    runtime_optimal: list[fx.Node]
    config: PartitionConfig = field(default_factory=PartitionConfig)  # the call's settings
    # Per-node network results shared by every cut of this search (see network.NetworkMemo).
    memo: NetworkMemo = field(default_factory=NetworkMemo, repr=False)
    min_bytes: int = 0
    max_bytes: int = 0
    # Filled in by the escalation steps (empty when an earlier step already fits).
    more_aggressive: list[fx.Node] = field(default_factory=list)
    aggressive_options: MinCutOptions | None = None
    aggressive: list[fx.Node] = field(default_factory=list)
    aggressive_banned: list[fx.Node] = field(default_factory=list)
    candidates: list[fx.Node] = field(default_factory=list)  # recomputable banned, big first
    must_save: list[fx.Node] = field(default_factory=list)
    memories: list[float] = field(default_factory=list)      # normalized to the budget range
    # The candidates' runtime estimates, made on first use (``item_runtimes``): budget 0
    # recomputes every candidate whatever it costs, so it needs none.
    runtimes: list[float] | None = None
    # Every cut made, by its saved set: the partition report explains the chosen one.
    solutions: dict[frozenset[fx.Node], MinCutSolution] = field(default_factory=dict)
    # The options each of those cuts was made under (the report names their active rules).
    options_of: dict[frozenset[fx.Node], MinCutOptions] = field(default_factory=dict)
    # The backward live sets ``needed_by_backward`` found, by the backward's input set
    # (``extract.backward_live_nodes``): extracting the chosen cut does not walk again.
    backward_live: dict[frozenset[fx.Node], set[fx.Node]] = field(default_factory=dict,
                                                                 repr=False)
    # The byte budget's candidate cuts (``caps.cut_candidates``: ``caps.CutCandidate``s),
    # built on first use.
    cut_candidates_cache: list[Any] | None = field(default=None, repr=False)
    # The "ilp_graph" solver's time limit (None: ILP_GRAPH_TIME_LIMIT_S) and whether an answer
    # HiGHS did not prove optimal is dropped for the "dp" one (deterministic answers).
    ilp_time_limit_s: float | None = None
    ilp_optimal_only: bool = False
    # ``core_budget_graph``'s translations, by estimator (the items' runtimes depend on it).
    core_graphs: dict[str, tuple[CoreGraph, dict[str, Any]]] = field(default_factory=dict,
                                                                      repr=False)
    # A region budget over the whole forward (torch's region_activation_memory_budget): 0.0
    # means checkpointing the whole region, so the inputs, alive anyway, cost nothing.
    inputs_alive: bool = False
    # Step 2's cut was made (``more_aggressive`` is filled only then; it may be empty).
    _more_made: bool = field(default=False, repr=False)
    # Step 3's cut was made (``aggressive``); budget 0 needs only its bans.
    _aggressive_made: bool = field(default=False, repr=False)

    def solve(self, options: MinCutOptions, dont_ban: set[fx.Node] | None = None
              ) -> tuple[list[fx.Node], list[fx.Node]]:
        """``solve_min_cut`` that remembers the cut's solution (its bans and their reasons)."""
        solution = solve_min_cut_detailed(self.joint_graph, self.node_info, options, dont_ban,
                                          memo=self.memo, config=self.config)
        key = frozenset(solution.saved_values)
        self.solutions[key] = solution
        self.options_of.setdefault(key, options)
        return solution.saved_values, list(solution.banned)

    def solution_for(self, saved: list[fx.Node]) -> MinCutSolution | None:
        """The min-cut solution that chose ``saved`` (None for the inputs-only answer)."""
        return self.solutions.get(frozenset(saved))

    @classmethod
    def prepare(cls, joint_graph: fx.Graph, node_info: NodeInfo, *, solver: str | None = None,
                estimator: str | None = None, config: PartitionConfig | None = None
                ) -> BudgetSearch:
        """The search under ``config`` (default: the flags now); ``solver`` and ``estimator``
        override its ``budget_solver`` and ``runtime_estimator``."""
        config = config if config is not None else PartitionConfig.from_flags()
        solver = _budget_solver(solver if solver is not None else config.budget_solver)
        estimator = check_estimator(estimator if estimator is not None
                                    else config.runtime_estimator)
        search = cls(joint_graph, node_info, solver, estimator, config.options, [], config)
        search.runtime_optimal, _ = search.solve(search.options)
        runtime_optimal = search.runtime_optimal
        search.min_bytes = _activation_bytes(node_info.inputs)
        search.max_bytes = _activation_bytes(runtime_optimal)
        return search

    def with_estimator(self, estimator: str) -> BudgetSearch:
        """This search under another runtime estimator: the same cuts, bans and knapsack items
        (none depends on the estimator), the items' runtimes estimated again. Shares this
        search's network memo and its record of cuts, so the report can explain either's."""
        estimator = check_estimator(estimator)
        if estimator == self.estimator:
            return self
        if self.has_range:  # without a range no budget makes a cut beyond the optimal one
            self._escalate()
        return replace(self, estimator=estimator, runtimes=None, cut_candidates_cache=None)

    def ilp_size(self) -> int:
        """The number of forward nodes the "ilp_graph" solver's MILP would have."""
        return len(_ilp_forward_nodes(self))

    @property
    def has_range(self) -> bool:
        """False when the runtime-optimal cut is no bigger than the inputs: nothing to trade."""
        return self.max_bytes > self.min_bytes

    def memory_ratio(self, saved: list[fx.Node]) -> float:
        """Where ``saved`` sits between inputs-only (0.0) and runtime-optimal (1.0)."""
        if not self.has_range:
            return 0.0
        return (_activation_bytes(saved) - self.min_bytes) / (self.max_bytes - self.min_bytes)

    def _more_options(self) -> MinCutOptions:
        return replace(self.options, ban_if_used_far_apart=False,
                       ban_if_long_fusible_chains=False, ban_if_materialized_backward=False)

    def _escalate(self) -> None:
        """Both escalation cuts and the knapsack items (each made once)."""
        self._escalate_more()
        self._escalate_aggressive()

    def _escalate_more(self) -> None:
        """Step 2's cut (budget 0 does not need it)."""
        if self._more_made:
            return
        self.more_aggressive, _ = self.solve(self._more_options())
        self._more_made = True

    def _escalate_aggressive(self) -> None:
        """Step 3's cut and the knapsack items (each made once)."""
        self._aggressive_items()
        if self._aggressive_made:
            return
        assert self.aggressive_options is not None
        self.aggressive, _ = self.solve(self.aggressive_options)
        self._aggressive_made = True

    def _aggressive_items(self) -> None:
        """Step 3's bans and the knapsack items they give, without step 3's cut: all that
        budget 0 needs, since it recomputes every item."""
        if self.aggressive_options is not None:
            return
        aggressive_options = replace(self._more_options(), ban_if_not_in_allowlist=False)
        self.aggressive_banned = list(min_cut_bans(self.joint_graph, self.node_info,
                                                   aggressive_options, memo=self.memo,
                                                   config=self.config))
        self.aggressive_options = aggressive_options
        self._collect_candidates(self.aggressive_banned)

    def fits_more_aggressive(self, memory_budget: float) -> bool:
        """Step 2's cut is under ``memory_budget`` (the search stops there)."""
        self._escalate_more()
        return self.memory_ratio(self.more_aggressive) < memory_budget

    def fits_aggressive(self, memory_budget: float) -> bool:
        """Step 3's cut is under ``memory_budget``."""
        self._escalate_aggressive()
        return self.memory_ratio(self.aggressive) < memory_budget

    def has_candidates(self) -> bool:
        """The knapsack has items (step 4 can release something)."""
        self._escalate_aggressive()
        return bool(self.candidates)

    def _collect_candidates(self, banned: list[fx.Node]) -> None:
        self.must_save, self.candidates = recompute_candidates(self.node_info, banned,
                                                               self.options)
        span = self.max_bytes - self.min_bytes
        # Without a range no fraction runs the knapsack (saved_values answers first), but the
        # items still price the caps' candidates (their runtimes): no share to divide then.
        self.memories = ([recompute_savings(n) / span for n in self.candidates] if span > 0
                         else [0.0] * len(self.candidates))
        self.runtimes = None

    def knapsack(self, memory_budget: float, solver: str | None = None) -> KnapsackResult:
        """(kept runtime, saved indices, recompute indices) over ``candidates``."""
        solver = solver or self.solver
        if solver == "dp_graph":
            return graph_aware_knapsack(self, memory_budget)
        return get_knapsack_solver(solver)(self.memories, self.item_runtimes(),
                                           max(memory_budget, 0.0))

    def item_runtimes(self) -> list[float]:
        """The knapsack items' (``candidates``) runtime estimates, estimated once."""
        self._aggressive_items()
        if self.runtimes is None:
            self.runtimes = [estimate_runtime(n, self.estimator) for n in self.candidates]
        return self.runtimes

    @property
    def zero_can_differ(self) -> bool:
        """Whether budget 0 may take another cut than the runtime-optimal one: there is a
        range to trade, a region's inputs are alive anyway, or the optimal cut saves
        intermediates that weigh exactly what the inputs do (a joint whose tangents are
        constants saves its gradients): torch's budget 0 saves the inputs then, and a tie
        goes to the inputs here too (``_recompute_everything``)."""
        return (self.inputs_alive or self.has_range
                or (self.max_bytes == self.min_bytes
                    and not saves_inputs_only(self.runtime_optimal, self.node_info.inputs)))

    def least_memory_values(self) -> list[fx.Node]:
        """``saved_values(0)``'s saved set without its runtime (no estimate is made)."""
        if self.zero_can_differ:
            self._aggressive_items()  # the options and the candidates it releases
            return self._recompute_everything()
        return list(self.runtime_optimal)  # the optimal cut is no bigger than the inputs

    def saved_values(self, memory_budget: float,
                     dp_answer: tuple[list[fx.Node], float] | None = None
                     ) -> tuple[list[fx.Node], float]:
        """(saved values, estimated recompute runtime of released banned nodes) at a budget.

        ``dp_answer``: for the "ilp_graph" solver, the "dp" solver's answer at this budget
        under the same estimator, when the caller already has it (it is not solved again)."""
        memory_budget = validate_memory_budget(memory_budget)
        if memory_budget == 0 and self.zero_can_differ:
            saved = self.least_memory_values()
            return saved, float(sum(self.item_runtimes()))
        if not self.has_range:  # the optimal cut is already no bigger than the inputs
            return list(self.runtime_optimal), 0.0
        if memory_budget == 1:
            return list(self.runtime_optimal), 0.0
        if self.solver == "ilp_graph":
            self._escalate()
            # The MILP may save no more than the "dp" answer does, so it never loses to it on
            # memory and only spends what it saves in recompute.
            reference, reference_runtime = (
                dp_answer if dp_answer is not None
                else self._escalation_or_knapsack(memory_budget, "dp"))
            found = ilp_graph_saved_values(self, memory_budget,
                                           max_bytes=_activation_bytes(reference),
                                           reference=reference,
                                           time_limit_s=self.ilp_time_limit_s,
                                           optimal_only=self.ilp_optimal_only)
            return found if found is not None else (reference, reference_runtime)
        return self._escalation_or_knapsack(memory_budget, self.solver)

    def _recompute_everything(self) -> list[fx.Node]:
        """The least memory: the inputs alone (the seed's answer) or the min-cut with every
        candidate released, whichever the backward reads fewer bytes of. A small intermediate
        can be cheaper to save than a big input; nodes that are never recomputed (MUST_SAVE,
        unreplayable random ops, effects, collectives: ``never_released``) stay in the forward,
        so then only the cut qualifies."""
        assert self.aggressive_options is not None
        cut, _ = self.solve(self.aggressive_options, set(self.candidates))
        if self.must_save:
            # Only cuts qualify; the aggressive network weighs recompute differently, so the
            # runtime-optimal cut can read fewer bytes (a collective saved before a cheap op):
            # budget 0 never saves more than budget 1.
            return min(cut, list(self.runtime_optimal),
                       key=lambda saved: _activation_bytes(needed_by_backward(self, saved)))
        inputs = list(self.node_info.inputs)
        if self.inputs_alive:  # new memory first: an intermediate saved costs, an input not
            return min(cut, inputs, key=self._new_then_all_bytes)
        if saves_inputs_only(cut, inputs):
            return inputs  # a tie, which the inputs win
        cut_bytes = _activation_bytes(needed_by_backward(self, cut))
        return cut if cut_bytes < _activation_bytes(needed_by_backward(self, inputs)) else inputs

    def _new_then_all_bytes(self, saved: list[fx.Node]) -> tuple[int, int]:
        """(bytes the backward reads beyond the inputs' storages, all bytes it reads)."""
        read = needed_by_backward(self, saved)
        alive = {_storage_key(n) for n in self.node_info.inputs} - {None}
        new = [n for n in read if _storage_key(n) not in alive]
        return _activation_bytes(new), _activation_bytes(read)

    def _escalation_or_knapsack(self, memory_budget: float, solver: str
                                ) -> tuple[list[fx.Node], float]:
        # Both cuts even where step 2's fits: the report explains a saved set by the last cut
        # that made it, which may be step 3's (its ban reasons), so skipping it changes them.
        self._escalate()
        if self.fits_more_aggressive(memory_budget):
            return list(self.more_aggressive), 0.0
        if self.fits_aggressive(memory_budget):
            return list(self.aggressive), 0.0
        if not self.candidates:
            return self._recompute_everything(), 0.0
        kept_runtime, _, recompute_idx = self.knapsack(memory_budget, solver)
        dont_ban = {self.candidates[i] for i in recompute_idx}
        assert self.aggressive_options is not None
        saved, _ = self.solve(self.aggressive_options, dont_ban)
        return saved, float(sum(self.item_runtimes())) - kept_runtime


def graph_aware_knapsack(search: BudgetSearch, memory_budget: float) -> KnapsackResult:
    """The "dp_graph" solver: the DP knapsack, then repair what it ignores.

    Releasing a banned node lets the final cut recompute it, but recomputing it needs its own
    inputs in the backward, so the final cut may save other (cheaper to keep) values instead
    and overshoot the budget. While the final cut is over budget, the kept node with the least
    runtime per byte is released too (at most ``DP_GRAPH_MAX_REPAIRS`` extra cuts).
    """
    runtimes = search.item_runtimes()
    kept_runtime, saved_idx, recompute_idx = dp_knapsack(search.memories, runtimes,
                                                         max(memory_budget, 0.0))
    assert search.aggressive_options is not None
    order = sorted(saved_idx, key=lambda i: runtimes[i] / max(search.memories[i], 1e-12))
    released = set(recompute_idx)
    for _ in range(DP_GRAPH_MAX_REPAIRS + 1):
        dont_ban = {search.candidates[i] for i in released}
        saved, _ = search.solve(search.aggressive_options, dont_ban)
        if search.memory_ratio(saved) <= memory_budget or not order:
            break
        released.add(order.pop(0))
    kept = sorted(set(range(len(search.candidates))) - released)
    runtime = float(sum(runtimes[i] for i in kept))
    return runtime, kept, sorted(released)


def _ilp_forward_nodes(search: BudgetSearch) -> list[fx.Node]:
    """The MILP's forward nodes, in graph order: the required forward nodes (not inputs) and
    the unclaimed nodes computable from them (the mean/rstd ``getitem``s of a forward
    ``native_layer_norm`` that only the backward reads). The min cut can save those; without
    them the MILP could reach them only by recomputing the tuple node."""
    info = search.node_info
    inputs = set(info.inputs)
    found: set[fx.Node] = set()
    for node in search.joint_graph.nodes:
        if node in inputs or node.op != "call_function":
            continue
        if node in info.required_fw or (node in info.unclaimed and all(
                arg in found or arg in inputs for arg in node.all_input_nodes)):
            found.add(node)
    return [node for node in search.joint_graph.nodes if node in found]


def _ilp_savable(node: fx.Node) -> bool:
    """The min cut's rule (network.py): a tensor, a symbolic scalar, a BackwardState or an
    opaque object can be saved; a tuple-valued node (``native_layer_norm``) cannot, its
    ``getitem``s are."""
    return (is_sym_node(node) or isinstance(node.meta.get("val"), (torch.Tensor, BackwardState))
            or is_opaque(node))


def ilp_graph_saved_values(search: BudgetSearch, memory_budget: float, *,
                           max_bytes: float | None = None,
                           reference: Sequence[fx.Node] | None = None,
                           time_limit_s: float | None = None, optimal_only: bool = False
                           ) -> tuple[list[fx.Node], float] | None:
    """The "ilp_graph" answer: (saved values in graph order, estimated recompute runtime).

    Describes the forward graph as arrays for ``ilp_graph.solve_save_or_recompute`` and reads
    its answer back. ``max_bytes`` caps the saved bytes further (the "dp" answer's);
    ``reference`` (the "dp" answer's saved values) competes with the MILP's answer. None when
    the reference is no worse, or HiGHS finds no feasible answer in time (or, with
    ``optimal_only``, none it proved optimal): the caller then uses the "dp" answer.
    ``time_limit_s``: HiGHS's limit (default ``ILP_GRAPH_TIME_LIMIT_S``).
    """
    info = search.node_info
    forward = _ilp_forward_nodes(search)
    forward_set = set(forward)
    graph_inputs = list(info.inputs)
    index = {node: i for i, node in enumerate(forward)}
    n = len(forward)
    index.update((node, n + k) for k, node in enumerate(graph_inputs))
    still_banned = set(search.aggressive_banned) - set(search.candidates)

    bw_outputs = set(info.bw_outputs)

    def read_by_backward(node: fx.Node) -> bool:
        # A gradient output that is a forward value (a DTensor gradient's mesh: an opaque
        # input) is read by the backward too.
        return node in bw_outputs or any(user not in forward_set and user.op != "output"
                                         for user in node.users)

    capacity = search.min_bytes + max(memory_budget, 0.0) * (search.max_bytes - search.min_bytes)
    if max_bytes is not None:
        capacity = min(capacity, max_bytes)
    problem = SaveOrRecompute(
        sizes=np.array([node_nbytes(node) for node in forward + graph_inputs], dtype=np.float64),
        runtimes=np.array([estimate_runtime(node, search.estimator) for node in forward],
                          dtype=np.float64),
        read_by_backward=np.array([read_by_backward(node) for node in forward + graph_inputs],
                                  dtype=bool),
        recomputable=np.array([node not in still_banned for node in forward], dtype=bool),
        reads=[[index[arg] for arg in node.all_input_nodes if arg in index] for node in forward],
        capacity=capacity,
        estimator=search.estimator,
        savable=np.array([_ilp_savable(node) for node in forward], dtype=bool),
    )
    baseline = None
    if reference is not None:
        kept = set(reference)
        baseline = evaluate(problem, np.array([node in kept for node in forward], dtype=bool),
                            np.array([node in kept for node in graph_inputs], dtype=bool))
    answer = solve_save_or_recompute(problem, reference=baseline, time_limit_s=time_limit_s,
                                     deterministic=spmd.deterministic_limits())
    if answer is not None and optimal_only and answer.time_limited:
        log.info("ilp_graph: at budget %.3f the dp answer is used (no proven optimum in time)",
                 memory_budget)
        return None
    if answer is None or answer.source == "reference":
        log.info("ilp_graph: at budget %.3f the dp answer is used (%s)", memory_budget,
                 "no MILP answer" if answer is None else "no worse than the MILP's")
        return None
    chosen = {forward[v] for v in np.flatnonzero(answer.save).tolist()}
    chosen |= {graph_inputs[k] for k in np.flatnonzero(answer.keep).tolist()}
    order = {node: i for i, node in enumerate(search.joint_graph.nodes)}
    return sorted(chosen, key=order.__getitem__), answer.runtime


def choose_saved_values_set(joint_graph: fx.Graph, node_info: NodeInfo,
                            memory_budget: float, *, config: PartitionConfig | None = None
                            ) -> list[fx.Node]:
    """The values to save under ``memory_budget`` (0.0 to 1.0; see module doc)."""
    memory_budget = validate_memory_budget(memory_budget)
    search = BudgetSearch.prepare(joint_graph, node_info, config=config)
    return search.saved_values(memory_budget)[0]


def core_budget_graph(search: BudgetSearch) -> tuple[CoreGraph, dict[str, Any]]:
    """The joint of ``search`` as the core's budget search sees it: (graph, the keywords of
    ``core.partition_under_budget`` but the budget).

    The graph is the adapter's description (fx/network.py, the description every cut of the
    search is made from) with the rules of the runtime-optimal cut; a node's ``runtime`` is
    the search's estimate for its knapsack items (``candidates``: the nodes still banned under
    the aggressive options) and 0 elsewhere, so the core's runtime-optimal cut is this
    search's, and the bans the escalation lifts cost the core's knapsack nothing, as the
    escalation lifts them at no estimated runtime (caps.choose_candidate says the same).
    Call it while the joint is prepared (as ``BudgetSearch.prepare``); made once per
    estimator, so the core keeps its candidate cuts for the next budget."""
    found = search.core_graphs.get(search.estimator)
    if found is not None:
        return found
    search._aggressive_items()  # the candidates
    runtimes = dict(zip(search.candidates, search.item_runtimes()))
    ctx = PolicyContext.create(default_op_types(), search.node_info, search.options,
                               search.config)
    desc = search.memo.description(search.joint_graph, ctx)
    nodes = tuple(replace(node, runtime=float(runtimes.get(fx_node, 0.0)))
                  if fx_node in runtimes else node
                  for fx_node, node in zip(desc.nodes, desc.graph.nodes))
    graph = CoreGraph(nodes)
    distances = desc.graph._cache.get("distances")
    if distances is not None:  # the classification's hops to the backward, as every cut
        use_distances(graph, distances)
    found = search.core_graphs[search.estimator] = (graph, core_options(desc, ctx))
    return found


def core_saved_values(search: BudgetSearch, **budget: Any
                      ) -> tuple[list[fx.Node], BudgetedPartition]:
    """The core's search on ``core_budget_graph(search)``: (saved values in graph order, the
    core's answer). ``budget``: ``partition_under_budget``'s ``fraction``, ``fraction_of``,
    ``max_saved_bytes`` or ``max_peak_bytes`` (and ``knapsack``, default the search's solver
    when it is a knapsack solver)."""
    graph, options = core_budget_graph(search)
    knapsack = budget.pop("knapsack", search.solver if search.solver in KNAPSACK_SOLVERS
                          else "dp")
    solver, _ = selected_solver(search.config.min_cut_solver)  # the fx path's cuts' solver
    answer = partition_under_budget(graph, knapsack=knapsack, solver=solver, **options,
                                    **budget)
    by_id = {node.name: node for node in search.joint_graph.nodes}
    return [by_id[name] for name in answer.saved], answer
