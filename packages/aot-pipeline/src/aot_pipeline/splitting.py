"""The split decision around each graph's compile: the LM head and its loss in chunks of tokens.

``options.split`` (``aot_config.functorch.activation_token_split``):

- an int N >= 2: every recognised loss site (aot_partition.split.token_split) is split into N
  chunks (MLPs are split by "auto" only);
- False: never;
- "auto" (the default): without a peak cap nothing changes. Under a peak cap the graph is
  first partitioned whole (plans compared are partitioned and priced, not compiled: only the
  plan kept reaches Inductor's code generation; ``_Plan``). When the cap is unreachable that way (``UnreachableMemoryBudgetError``:
  recompute and offload cannot fit) it is split, into the fewest chunks (powers of two) whose
  estimated saving, one logits buffer's share, covers the gap the error names, doubling while
  the cap stays unreachable; at least 128 tokens a chunk (smaller matmuls run far below the
  device's peak). Gradients are made in the forward (no matmul more than unsplit); only if no
  count fits that way, the most chunks with the logits recomputed in the backward (one matmul
  more, nothing but the log-sum-exp kept). The last error is raised if nothing fits. When the
  cap is reachable whole but only by recomputing, splits are partitioned too (from the most
  chunks of at least 1,024 tokens, doubling while the split still recomputes beyond its
  uncapped cut, down to 128 tokens a chunk) and the plan whose cut recomputes least beyond its
  uncapped cut (the roofline's estimate; the loss itself is not compared, as the roofline
  prices an unsplit loss unfused) is kept: the cheapest way to fit. Reachable whole with no more recompute than
  uncapped: never split. Only when no split of the loss fits are the MLPs split too
  (``find_split_sites(kinds=("mlp",))``: the Mini-Sequence Transformer's split, each MLP
  recomputing its input projections in the backward); a graph without a loss but with MLPs
  gets that step alone.

Each decision is recorded (``PartitionRecorder.splits``) and logged. A chunk count asked for
that finds nothing to split in a graph is said once, as a ``SplitMatchedNothingWarning``
naming why (no projection followed by a cross-entropy, or the reason the loss was left whole).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from . import _compat, step_cap
from .options import PipelineOptions
from .recording import PartitionedOnly, PartitionRecorder
from .step_cap import StepCap

log = logging.getLogger(__name__)

CompiledGraph = Callable[..., Any]
GraphCompiler = Callable[[fx.GraphModule, Sequence[Any]], CompiledGraph]
MIN_CHUNK_TOKENS = 128  # fewer rows a matmul and it runs far below peak FLOP/s
MAX_CHUNKS = 64
# Chunks of at least this many tokens keep a matmul near the device's peak FLOP/s: the count
# tried when the split only competes with recompute (the cap is reachable whole).
PREFERRED_CHUNK_TOKENS = 1024


class SplitMatchedNothingWarning(UserWarning):
    """``split=N`` was asked for, but a compiled graph has no loss it can split: the graph
    compiles whole. The message says why."""


def warn_split_matched_nothing(chunks: int, left: Sequence[Any]) -> None:
    """One warning for an explicit ``split`` that finds nothing in a graph, with the reason:
    the losses left whole and why, or that no LM head and loss are in the graph at all (the
    usual cause: the model returns logits and the loss is computed outside what is compiled).
    The text repeats across graphs, so Python's default filter shows it once."""
    losses = [alone for alone in left if alone.kind == "loss"]
    if losses:
        why = "; ".join(f"{alone.loss}: {alone.reason}" for alone in losses)
        reason = f"its cross-entropy is left whole ({why})"
    else:
        reason = ("no linear projection followed by a cross-entropy loss is in it (compile "
                  "the loss with the model: the LM head and its loss must be in one graph)")
    warnings.warn(f"split={chunks} was asked for, but a compiled graph has nothing to split: "
                  f"{reason}; that graph compiles whole", SplitMatchedNothingWarning,
                  stacklevel=2)


def has_peak_cap(options: PipelineOptions) -> bool:
    return options.memory_peak_bytes is not None or options.memory_peak_fraction is not None


def _wrapped(error: BaseException, kind: type[BaseException]) -> Any:
    """The ``kind`` exception a compile failure wraps (its causes, contexts and Inductor's
    ``inner_exception``), or None."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        stack += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return None


def _unreachable(error: BaseException) -> Any:
    """The UnreachableMemoryBudgetError a compile failure wraps, or None."""
    from aot_partition import UnreachableMemoryBudgetError

    return _wrapped(error, UnreachableMemoryBudgetError)


def held_input_bytes(example_inputs: Sequence[Any]) -> int | None:
    """Bytes of a graph's tensor inputs, each storage once: the caller holds them through the
    whole step, so every plan's modelled peak is at least this. None under symbolic shapes."""
    from aot_partition.fx.sizes import storage_key

    held: dict[int, int] = {}
    for value in example_inputs:
        if not isinstance(value, torch.Tensor):
            continue
        numel = value.numel()
        if not isinstance(numel, int):
            return None
        key = storage_key(value)
        key = id(value) if key is None else key
        held[key] = max(held.get(key, 0), numel * value.element_size())
    return sum(held.values())


def attempts_that_can_fit(attempts: list[Any], floor: int | None, cap: int) -> list[Any]:
    """The split attempts worth compiling under ``cap``, most frugal last. Every plan holds
    the graph's inputs (``floor`` bytes) from start to end: below them none fits, and the most
    frugal alone is tried, for the least this graph can peak at (what the full sweep's last
    attempt says; under best effort, the plan compiled): a refusal then prices one plan, not
    all of them."""
    if floor is None or floor <= cap or len(attempts) <= 1:
        return attempts
    log.info("peak cap %d bytes is below this graph's inputs (%d bytes), which every plan "
             "holds: no split fits; only the most frugal, %s, is priced", cap, floor,
             attempts[-1])
    return attempts[-1:]


def chunk_counts(sites: Sequence[Any], gap_bytes: int) -> list[int]:
    """The chunk counts to try, fewest first (aot_partition.split.chunk_count): from the least
    power of two whose saving (one logits buffer of every site, less one chunk's) covers
    ``gap_bytes``, doubling up to the most that keeps ``MIN_CHUNK_TOKENS`` a chunk, then the
    last resorts down to 16 tokens a chunk."""
    from aot_partition.split.chunk_count import counts_for_gap

    return counts_for_gap(min(site.tokens for site in sites),
                          lambda k: sum(site.bytes_saved(k) for site in sites), gap_bytes)


def preferred_chunks(sites: Sequence[Any]) -> int:
    """The count tried against a whole graph that fits only by recomputing: the most chunks
    (a power of two) that keep ``PREFERRED_CHUNK_TOKENS`` tokens a chunk, at least 2."""
    tokens = min(site.tokens for site in sites)
    k = 2
    while k * 2 <= MAX_CHUNKS and tokens // (k * 2) >= PREFERRED_CHUNK_TOKENS:
        k *= 2
    return k


def split_counts_against_recompute(sites: Sequence[Any]) -> list[int]:
    """The chunk counts tried against a whole graph that fits only by recomputing:
    ``preferred_chunks`` first, doubling up to the most ``chunk_counts`` allows (at least
    ``MIN_CHUNK_TOKENS`` a chunk)."""
    from aot_partition.split.chunk_count import most_chunks

    most = most_chunks(min(site.tokens for site in sites))
    counts = [preferred_chunks(sites)]
    while counts[-1] * 2 <= most:
        counts.append(counts[-1] * 2)
    return counts


def _partitioned_only(error: BaseException) -> bool:
    """Whether a compile failure is a plan stopped after partitioning (``PartitionedOnly``)."""
    return _wrapped(error, PartitionedOnly) is not None


class _Plan:
    """One plan the split decision compares: its recorder and, once known, what the cap costs
    it in recompute (``extra_recompute``). A plan the cap costs nothing is compiled at once,
    as it will be kept (``compile_if``); the others stop after partitioning, and only the one
    chosen is compiled, again (its partition then costs no lowering: lowering_memo.py)."""

    def __init__(self) -> None:
        self.extra: float | None = None
        self.record = PartitionRecorder(keep_joints=True, compile_if=self._compile_if)

    def _compile_if(self, record: PartitionRecorder) -> bool:
        self.extra = extra_recompute(record)
        return self.extra is None or self.extra <= 0


def extra_recompute(record: PartitionRecorder) -> float | None:
    """Seconds (the roofline's estimate) the cuts ``record`` holds recompute beyond what the
    same joints' uncapped cuts (budget 1.0, no cap) recompute: what the cap costs. None when
    nothing was partitioned. Only recompute is compared: the roofline prices an unsplit loss
    as separate passes, far above what Inductor's fused loss runs."""
    from aot_config import functorch as functorch_flags
    from aot_partition import min_cut_rematerialization_partition
    from aot_partition.costs.cut_runtime import recompute_estimate

    graphs = [(p.forward.graph, p.backward.graph) for p in record.partitions
              if p.backward is not None]
    if not graphs or len(record.joints) != len(record.partitions):
        return None
    capped = sum(recompute_estimate(fw, bw, "roofline") for fw, bw in graphs)
    uncapped = 0.0
    with functorch_flags.patch(activation_memory_budget=1.0,
                               activation_memory_budget_bytes=None,
                               activation_memory_peak_bytes=None,
                               activation_memory_peak_fraction=None):
        for recorded in record.joints:
            fw, bw = min_cut_rematerialization_partition(recorded.joint, recorded.inputs,
                                                         **recorded.kwargs)
            uncapped += recompute_estimate(fw.graph, bw.graph, "roofline")
    return max(capped - uncapped, 0.0)


def with_token_split(options: PipelineOptions, recorder: PartitionRecorder | None,
                     compiler_for: Callable[[PipelineOptions, PartitionRecorder | None],
                                            GraphCompiler],
                     step: StepCap | None = None) -> GraphCompiler:
    """A graph compiler that applies ``options.split`` before ``compiler_for(options, rec)``
    (``rec``: the recorder its partitions go to). With ``step`` (a peak cap), each graph is
    compiled under its share of the step's cap (step_cap.py) and an unreachable cap past the
    first graph is refused for the step (``StepPeakUnreachableError``)."""
    if step is None or not step.active:
        return _split_compiler(options, recorder, compiler_for)

    def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        from aot_partition.split.token_split import find_split_sites

        sites, left = find_split_sites(gm)
        graph = step.begin(gm, example_inputs, left,
                           bool(sites) and options.split is not False,
                           bool(sites) and options.split is False)
        limit = step.graph_peak_bytes(graph)
        graph_options = options if limit is None else replace(
            options, memory_peak_bytes=max(0, limit))
        # The chosen compile's partitions, to hold its saved bytes against the later graphs.
        local = PartitionRecorder(bypass_caches=recorder.bypass_caches
                                  if recorder is not None else False)
        with step_cap.compiling(graph.context, graph.sink):
            try:
                compiled = _split_compiler(graph_options, local, compiler_for)(gm, example_inputs)
            except Exception as error:
                unreachable = _unreachable(error)
                if unreachable is None or not graph.part_of_many:
                    raise
                raise step.refusal(graph, unreachable) from error
        step.commit(graph, local.partitions)
        if recorder is not None:
            for p in local.partitions:
                recorder.record_forward(p.forward, p.backward, p.num_fwd_outputs,
                                        p.static_input_indices, as_partitioned=p.as_partitioned)
            recorder.splits.extend(local.splits)
            recorder.split_left_alone.extend(local.split_left_alone)
        return compiled

    return compile_graph


def _split_compiler(options: PipelineOptions, recorder: PartitionRecorder | None,
                    compiler_for: Callable[[PipelineOptions, PartitionRecorder | None],
                                           GraphCompiler]) -> GraphCompiler:
    """``with_token_split`` for one graph's options (``options.split`` applied)."""
    plain = compiler_for(options, recorder)
    probe_options = replace(options, memory_budget_best_effort=False)

    def adopt(record: PartitionRecorder, decisions: Sequence[Any] = ()) -> None:
        """The chosen compile's partitions and decisions, handed to the user's recorder as
        if it had recorded them (through ``record_forward``, which callers may wrap)."""
        if recorder is not None:
            for p in record.partitions:
                recorder.record_forward(p.forward, p.backward, p.num_fwd_outputs,
                                        p.static_input_indices, as_partitioned=p.as_partitioned)
            recorder.splits.extend(decisions)

    def note_left_alone(left: Sequence[Any]) -> None:
        for alone in left:
            log.info("not split: %s (%s)", alone.loss, alone.reason)
        if recorder is not None:
            recorder.split_left_alone.extend(left)

    def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        from aot_partition.split.token_split import find_split_sites

        sites, left = find_split_sites(gm)
        note_left_alone(left)
        split = options.split
        if split is not False and isinstance(split, int) and not sites:
            warn_split_matched_nothing(split, left)
        if split is False or (isinstance(split, int) and not sites):
            return plain(gm, example_inputs)
        if isinstance(split, int):
            compiled, decisions = _compile_split(gm, example_inputs, split, plain,
                                                 "forward_grads", ("loss",))
            adopt(PartitionRecorder(), decisions)
            return compiled
        if not has_peak_cap(options) or (not sites
                                         and not find_split_sites(gm, kinds=("mlp",))[0]):
            return plain(gm, example_inputs)
        whole = _compat.copy_dynamo_graph(gm)
        # With a loss to split, the whole graph is a plan to compare: it stops after its
        # partition unless the cap costs it nothing (then it is kept and compiled at once).
        whole_plan = _Plan()
        whole_record = (whole_plan.record if sites
                        else PartitionRecorder(keep_joints=True))
        try:
            compiled = compiler_for(probe_options, whole_record)(gm, example_inputs)
        except Exception as error:
            if _partitioned_only(error):
                return _cheaper_of(whole, example_inputs, sites, whole_plan)
            unreachable = _unreachable(error)
            if unreachable is None:
                raise
            return _split_to_fit(whole, example_inputs, sites, unreachable, error)
        adopt(whole_record)  # fits with no recompute beyond uncapped, or nothing to split
        return compiled

    def _cheaper_of(whole: fx.GraphModule, example_inputs: Sequence[Any], sites: Sequence[Any],
                    whole_plan: _Plan) -> CompiledGraph:
        """The whole graph fits the cap only by recomputing more than it does uncapped
        (``whole_plan.extra``, the roofline's estimate): splits are partitioned too, from
        ``preferred_chunks`` doubling up to ``chunk_counts``' most, until one fits with no
        recompute beyond its uncapped cut (compiled at once: it is kept); the plan the cap
        costs the least recompute is kept, the whole graph on a tie: splitting may let the cut
        keep what the whole graph had to recompute, and more chunks free more (issue 50: at a
        cap 2 chunks still recompute, 16 do not). Plans compared and not kept are never
        compiled; the one kept, if it was only partitioned, is compiled after."""
        whole_extra = whole_plan.extra if whole_plan.extra is not None else float("inf")
        best: tuple[float, int, CompiledGraph | None, PartitionRecorder, list[Any]] | None = None
        tried: list[str] = []
        for chunks in split_counts_against_recompute(sites):
            plan = _Plan()
            split_compiled: CompiledGraph | None = None
            graph = _compat.copy_dynamo_graph(whole)
            decisions = _split_graph(graph, chunks, "forward_grads", ("loss",))
            try:
                split_compiled = compiler_for(probe_options, plan.record)(graph, example_inputs)
            except Exception as error:
                if not _partitioned_only(error):
                    if _unreachable(error) is None:
                        raise
                    tried.append(f"split in {chunks}: does not fit")
                    continue
            split_extra = float("inf") if plan.extra is None else plan.extra
            tried.append(f"split in {chunks}: {split_extra * 1e3:.3g} ms")
            if best is None or split_extra < best[0]:
                best = (split_extra, chunks, split_compiled, plan.record, decisions)
            if split_extra <= 0:
                break
        chosen = best is not None and best[0] < whole_extra
        log.info("under the peak cap the whole graph recomputes %.3g ms more than uncapped "
                 "(est.); %s: %s", whole_extra * 1e3, "; ".join(tried),
                 f"split in {best[1]}" if chosen and best is not None else "whole kept")
        if chosen and best is not None:
            if best[2] is not None:
                adopt(best[3], best[4])
                return best[2]
            record = PartitionRecorder()
            graph = _compat.copy_dynamo_graph(whole)
            _split_graph(graph, best[1], "forward_grads", ("loss",), quiet=True)
            compiled = compiler_for(probe_options, record)(graph, example_inputs)
            adopt(record, best[4])
            return compiled
        record = PartitionRecorder()
        compiled = compiler_for(probe_options, record)(_compat.copy_dynamo_graph(whole),
                                                       example_inputs)
        adopt(record)
        return compiled

    def _split_to_fit(whole: fx.GraphModule, example_inputs: Sequence[Any],
                      sites: Sequence[Any], unreachable: Any, failure: BaseException
                      ) -> CompiledGraph:
        """The cap is unreachable whole: the cheapest split that fits. The loss in the fewest
        chunks with its gradients made in the forward (no matmul more), then its logits
        recomputed (one matmul more); then the MLPs too (each recomputes its input
        projections in the backward), the same two ways."""
        from aot_partition.split.token_split import find_split_sites

        gap = unreachable.least - unreachable.cap
        mlp_sites, mlp_left = find_split_sites(whole, kinds=("mlp",))
        attempts: list[tuple[int, str, tuple[str, ...]]] = []
        if sites:
            counts = chunk_counts(sites, gap)
            attempts += [(k, "forward_grads", ("loss",)) for k in counts]
            attempts.append((counts[-1], "recompute", ("loss",)))
        if mlp_sites:
            both = [*sites, *mlp_sites]
            counts = chunk_counts(both, gap)
            attempts += [(k, "forward_grads", ("loss", "mlp")) for k in counts]
            if sites:
                attempts.append((counts[-1], "recompute", ("loss", "mlp")))
        attempts = attempts_that_can_fit(attempts, held_input_bytes(example_inputs),
                                         unreachable.cap)
        log.info("peak cap unreachable whole (least %d bytes, cap %d): trying splits %s",
                 unreachable.least, unreachable.cap, attempts)
        noted = False
        for i, (chunks, mode, kinds) in enumerate(attempts):
            last = i == len(attempts) - 1
            if "mlp" in kinds and not noted:  # the MLPs not split, once they are tried
                note_left_alone(mlp_left)
                noted = True
            record = PartitionRecorder()
            try:
                compiled, decisions = _compile_split(
                    _compat.copy_dynamo_graph(whole), example_inputs, chunks,
                    compiler_for(options if last else probe_options, record), mode, kinds)
            except Exception as error:
                if _unreachable(error) is None:
                    raise
                failure = error
                continue
            adopt(record, decisions)
            return compiled
        raise failure

    return compile_graph


def _split_graph(gm: fx.GraphModule, chunks: int, mode: str, kinds: tuple[str, ...], *,
                 quiet: bool = False) -> list[Any]:
    """The sites of ``kinds`` in ``gm`` split in place into ``chunks``; the decisions made
    (logged unless ``quiet``: the same split again)."""
    from aot_partition.split.token_split import find_split_sites, split_token_wise

    sites = find_split_sites(gm, kinds=kinds)[0]
    decisions = split_token_wise(gm, chunks, sites=sites, mode=mode)
    for decision in decisions if not quiet else ():
        log.info("split: %s", decision.describe())
    return decisions


def _compile_split(gm: fx.GraphModule, example_inputs: Sequence[Any], chunks: int,
                   compile_graph: GraphCompiler, mode: str, kinds: tuple[str, ...]
                   ) -> tuple[CompiledGraph, list[Any]]:
    """The sites of ``kinds`` in ``gm`` split in place into ``chunks`` and compiled; the
    decisions made."""
    decisions = _split_graph(gm, chunks, mode, kinds)
    return compile_graph(gm, example_inputs), decisions
