"""The split decision around each graph's compile: the LM head and its loss in chunks of tokens.

``options.split`` (``aot_config.functorch.activation_token_split``):

- an int N >= 2: every recognised site (aot_partition.fx.token_split) is split into N chunks;
- False: never;
- "auto" (the default): without a peak cap nothing changes. Under a peak cap the graph is
  first compiled whole; only when the cap is unreachable that way
  (``UnreachableMemoryBudgetError``: recompute and offload cannot fit) is it split, into the
  fewest chunks (powers of two) whose estimated saving, one logits buffer's share, covers the
  gap the error names, doubling while the cap stays unreachable; at least 128 tokens a chunk
  (smaller matmuls run far below the device's peak). Gradients are made in the forward
  (no matmul more than unsplit); only if no count fits that way, the most chunks with the
  logits recomputed in the backward (one matmul more, nothing but the log-sum-exp kept). The
  last error is raised if nothing fits.

Each decision is recorded (``PartitionRecorder.splits``) and logged.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch.fx as fx

from .options import PipelineOptions
from .recording import PartitionRecorder

log = logging.getLogger(__name__)

CompiledGraph = Callable[..., Any]
GraphCompiler = Callable[[fx.GraphModule, Sequence[Any]], CompiledGraph]
MIN_CHUNK_TOKENS = 128  # fewer rows a matmul and it runs far below peak FLOP/s
MAX_CHUNKS = 64


def has_peak_cap(options: PipelineOptions) -> bool:
    return options.memory_peak_bytes is not None or options.memory_peak_fraction is not None


def _unreachable(error: BaseException) -> Any:
    """The UnreachableMemoryBudgetError a compile failure wraps, or None."""
    from aot_partition import UnreachableMemoryBudgetError

    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UnreachableMemoryBudgetError):
            return e
        stack += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return None


def chunk_counts(sites: Sequence[Any], gap_bytes: int) -> list[int]:
    """The chunk counts to try, fewest first: from the least power of two whose saving (one
    logits buffer of every site, less one chunk's) covers ``gap_bytes``, doubling up to the
    most that keeps ``MIN_CHUNK_TOKENS`` a chunk."""
    tokens = min(site.tokens for site in sites)
    most = max(2, min(MAX_CHUNKS, tokens // MIN_CHUNK_TOKENS))
    counts = []
    k = 2
    while k <= most:
        counts.append(k)
        k *= 2
    if not counts:
        counts = [2]
    first = next((i for i, k in enumerate(counts)
                  if sum(site.bytes_saved(k) for site in sites) >= gap_bytes), len(counts) - 1)
    return counts[first:]


def with_token_split(options: PipelineOptions, recorder: PartitionRecorder | None,
                     compiler_for: Callable[[PipelineOptions], GraphCompiler]) -> GraphCompiler:
    """A graph compiler that applies ``options.split`` before ``compiler_for(options)``."""
    plain = compiler_for(options)

    def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        from aot_partition.fx.token_split import find_split_sites

        sites, left = find_split_sites(gm)
        for alone in left:
            log.info("not split: %s (%s)", alone.loss, alone.reason)
        if recorder is not None:
            recorder.split_left_alone.extend(left)
        split = options.split
        if not sites or split is False:
            return plain(gm, example_inputs)
        if isinstance(split, int):
            return _compile_split(gm, example_inputs, split, plain, "forward_grads")
        if not has_peak_cap(options):
            return plain(gm, example_inputs)
        whole = copy.deepcopy(gm)
        probe = compiler_for(replace(options, memory_budget_best_effort=False))
        try:
            return probe(gm, example_inputs)
        except Exception as error:
            unreachable = _unreachable(error)
            if unreachable is None:
                raise
            failure: BaseException = error
        counts = chunk_counts(sites, unreachable.least - unreachable.cap)
        log.info("peak cap unreachable whole (least %d bytes, cap %d): splitting into %s chunks",
                 unreachable.least, unreachable.cap, counts)
        attempts = [(k, "forward_grads") for k in counts] + [(counts[-1], "recompute")]
        for i, (chunks, mode) in enumerate(attempts):
            last = i == len(attempts) - 1
            attempt = copy.deepcopy(whole)
            try:
                return _compile_split(attempt, example_inputs, chunks,
                                      plain if last else probe, mode)
            except Exception as error:
                if _unreachable(error) is None:
                    raise
                failure = error
                if recorder is not None:
                    del recorder.splits[-len(sites):]
        raise failure

    def _compile_split(gm: fx.GraphModule, example_inputs: Sequence[Any], chunks: int,
                       compile_graph: GraphCompiler, mode: str) -> CompiledGraph:
        from aot_partition.fx.token_split import split_token_wise

        decisions = split_token_wise(gm, chunks, mode=mode)
        for decision in decisions:
            log.info("split: %s", decision.describe())
        if recorder is not None:
            recorder.splits.extend(decisions)
        return compile_graph(gm, example_inputs)

    return compile_graph
