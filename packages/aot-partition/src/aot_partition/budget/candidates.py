"""The fixed set of candidate cuts a byte or peak cap chooses among (``cut_candidates``: the
runtime-optimal cut and the cuts at the fractions of ``BYTE_BUDGET_FRACTIONS``, under the
search's estimator and the reference estimator, made by search.py's ``BudgetSearch``), and the
byte measure a byte cap compares (``activation_bytes``). None of them depends on a cap."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch.fx as fx

from ..fx.extract import backward_live_nodes
from ..fx.joint import is_bwd_seed_offset, is_random, is_tangent
from ..fx.passes.rng import device_of, rng_state_nbytes
from ..fx.sizes import saved_bytes
from .search import BudgetSearch

__all__ = ["BYTE_BUDGET_FRACTIONS", "CutCandidate", "Measure", "activation_bytes", "candidate",
           "cut_candidates"]


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
