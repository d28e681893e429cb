"""One partition decision on every rank (SPMD training with torch.distributed).

When torch.distributed's default process group is initialized with more than one rank, every
rank partitions its own copy of the same joint graph. The decision must be the same on every
rank: ranks whose forward and backward differ can issue different collectives (a hang) or
silently train different programs. The partitioner is deterministic given its inputs except
in two places, which this module makes rank-independent (flag ``agree_partition_across_ranks``,
default on; ``PartitionConfig.agree_across_ranks``):

- **Measured runtimes** (the "profile" estimator: wall-clock medians). Before the budget search,
  every rank measures every op signature of the joint graph, then one all-reduce (MAX) of those
  K float64 times makes them one set of numbers on every rank (``agreed_runtimes``); the search
  reads only those. The maximum is exact (no rounding, any reduction order gives the same bits)
  and is the slowest rank's time, the one an SPMD step waits for. A 4-integer all-reduce before
  it checks that every rank has the same K and op sequence, and raises the same error on every
  rank when not (instead of a collective of mismatched sizes). Estimators that compute
  ("flops", "roofline", "testing") need nothing: they are deterministic by construction.
- **MILP time limits** (HiGHS in the "ilp_graph" solver and the reference check's exact
  candidate): a wall-clock limit stops each rank at a different point. With more than one rank
  the limit becomes a node limit (core/milp_limits.py's ``MILP_NODES_PER_SECOND`` nodes per second
  of it), a deterministic amount of work: the same answer on every rank, whatever its speed
  (``deterministic_limits``).

Cost: nothing unless the "profile" estimator is in use (as the estimator or the reference
estimator) at a budget that needs runtimes (below 1.0, or a byte cap). Then, per compiled
graph: two all-reduces on the default group, one of 4 int64 and one of K float64 (K: distinct
op signatures of the joint graph; repeated blocks share them: 104 for the built-in GPT with 2
or 32 blocks). An all-reduce sends about 2x its payload per rank whatever the number of ranks, so
the cost is the same on 8 and on 8,000 ranks (plus the ring's or tree's latency, log p with
NCCL's trees), and it grows linearly with the number of graphs compiled.

``check_partition_agreement`` (flag ``check_partition_agreement``, default off): after the
decision, one all-reduce (MAX) of 2 int64 (a 62-bit hash of the saved node names, negated too,
so max == -max(-x) says every rank agrees). Only on a mismatch does every rank gather the
others' saved names (``all_gather_object``) to raise ``PartitionDisagreementError`` naming the
nodes that differ, the same error on every rank.

Collectives run on the default group: on CPU tensors with gloo (and MPI), on the current CUDA
device with NCCL; always under ``_compat.real_kernels`` (real tensors, with torch's Python
dispatcher off: under it, back-to-back gloo collectives can deadlock, see there). Nothing runs
when torch.distributed is unavailable, not initialized, or has one rank. Every rank must compile
the same graphs in the same order (SPMD); ranks that compile different graphs (pipeline stages)
must turn ``agree_partition_across_ranks`` off and leave the check off. For the same reason a
cache that skips partitioning on a hit (AOTAutograd's) must be off on every rank whenever
``partitioning_runs_collectives``: a rank whose cache hits would skip the collectives the others
wait in (aot_pipeline turns it off).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ..config import PartitionConfig
from ..errors import PartitionDisagreementError
from ..fx.collectives import is_collective

log = logging.getLogger(__name__)

__all__ = [
    "Agreement",
    "PartitionDisagreementError",
    "agreed_runtime",
    "check_saved_agreement",
    "deterministic_limits",
    "multi_rank",
    "partitioning_runs_collectives",
    "rank_agreement",
]

# On many ranks a MILP's time limit becomes this many HiGHS branch-and-bound nodes per second
# of it (about what a 500-node save-or-recompute MILP explores per second on a busy 2-core VM):
# 10 s -> 2,000 nodes, the reference check's 2 s -> 400.
_HASH_BITS = 62  # fits an int64, and so does its negation
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_DIFFERENT_GRAPHS_HINT = ("the 'profile' estimator's times cannot be agreed. Ranks that compile "
                          "different graphs (pipeline stages) need the flag "
                          "agree_partition_across_ranks=False")


def multi_rank() -> bool:
    """Whether torch.distributed's default group is initialized with more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def partitioning_runs_collectives(config: PartitionConfig) -> bool:
    """Whether partitioning under ``config`` may run collectives here: many ranks, and the
    agreement of 'profile' times (as estimator or reference) or the saved-set check. A cache
    that skips partitioning (AOTAutograd's) must then be off on every rank: a rank that hits
    it would skip the collectives the others wait in. Conservative: it does not ask whether
    the budget needs runtimes (per-region budgets can, under a global 1.0)."""
    if not multi_rank():
        return False
    return (config.agree_across_ranks and _profiled(config)) or config.check_agreement


def _profiled(config: PartitionConfig) -> bool:
    """Whether the 'profile' estimator is in use, as the estimator or the reference one."""
    return "profile" in (config.runtime_estimator, config.reference_estimator)


def _collective_device() -> torch.device:
    """Where the default group's collectives take tensors: CPU for gloo (and MPI), the current
    CUDA device for NCCL, else the current accelerator."""
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if "gloo" in backend or backend == "mpi":
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None else None
    return current if current is not None else torch.device("cpu")


def _all_reduce_max(values: Sequence[float] | Sequence[int], dtype: torch.dtype) -> list[Any]:
    """Element-wise maximum over the ranks, on the default group (real tensors, also where the
    caller traces under a fake mode)."""
    import torch.distributed as dist

    from ..fx._compat import real_kernels

    with real_kernels():
        tensor = torch.tensor(list(values), dtype=dtype, device=_collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.cpu().tolist()


def _hash62(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> (64 - _HASH_BITS)


def _agrees(value: int) -> bool:
    """Whether every rank holds ``value`` (one all-reduce of [v, -v]: max == -min)."""
    high, negated_low = _all_reduce_max([value, -value], torch.int64)
    return bool(high == -negated_low)


# ---- the agreement in force during one partition --------------------------------------------

@dataclass(frozen=True)
class Agreement:
    """What one partition on many ranks reads instead of rank-local measurements."""

    profile_ms: dict[Hashable, float] | None   # op signature -> agreed 'profile' time (ms)
    deterministic_limits: bool                 # MILP node limits instead of time limits


_CURRENT: contextvars.ContextVar[Agreement | None] = contextvars.ContextVar(
    "aot_partition_rank_agreement", default=None)


def current() -> Agreement | None:
    """The agreement of the partition running in this context (None: one rank, or off)."""
    return _CURRENT.get()


@contextlib.contextmanager
def rank_agreement(joint_graph: fx.Graph, config: PartitionConfig, *, needs_runtimes: bool,
                   measure: Callable[[fx.Node], float],
                   signature: Callable[[fx.Node], Hashable | None]) -> Iterator[None]:
    """Run one partition's decision under a rank agreement (see module doc); nothing on one
    rank or with ``config.agree_across_ranks`` off. ``needs_runtimes``: the decision estimates
    runtimes (a budget below 1.0 or a byte cap); ``measure``/``signature``: the 'profile'
    estimator's local measurement of a node and its cache key (None: unhashable)."""
    if not (config.agree_across_ranks and multi_rank()):
        yield
        return
    table = (agree_on_profile_times(joint_graph, measure, signature)
             if _profiled(config) and needs_runtimes else None)
    token = _CURRENT.set(Agreement(table, deterministic_limits=True))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def agree_on_profile_times(joint_graph: fx.Graph, measure: Callable[[fx.Node], float],
                           signature: Callable[[fx.Node], Hashable | None]
                           ) -> dict[Hashable, float]:
    """Every rank's 'profile' times of ``joint_graph``'s ops, reduced to their maximum over
    the ranks: op signature -> milliseconds, the same on every rank."""
    keys: dict[Hashable, fx.Node] = {}
    for node in joint_graph.nodes:
        if node.op != "call_function" or not callable(node.target) or is_collective(node):
            continue
        key = signature(node)
        if key is not None:
            keys.setdefault(key, node)
    # The signatures themselves (ops, shapes, dtypes), without object addresses.
    ops = _ADDRESS.sub("", "/".join(map(repr, keys)))
    header = _all_reduce_max([len(keys), -len(keys), _hash62(ops), -_hash62(ops)],
                             torch.int64)
    if header[0] != -header[1]:
        other = header[0] if header[0] != len(keys) else -header[1]
        raise PartitionDisagreementError(
            f"ranks compile different graphs: this rank's joint graph has {len(keys)} distinct "
            f"op signatures to profile, another's {other}; {_DIFFERENT_GRAPHS_HINT}")
    if header[2] != -header[3]:
        raise PartitionDisagreementError(
            f"ranks compile different graphs: the ranks' joint graphs have {len(keys)} distinct "
            f"op signatures to profile each, but not the same ones; {_DIFFERENT_GRAPHS_HINT}")
    local = [float(measure(node)) for node in keys.values()]
    agreed = _all_reduce_max(local, torch.float64) if local else []
    log.info("rank agreement: %d profiled op times reduced (max) over %d ranks", len(local),
             _world_size())
    return dict(zip(keys, agreed))


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


def agreed_runtime(key: Hashable | None) -> float | None:
    """The agreed 'profile' time of op signature ``key`` in the running partition; None when
    no agreement is in force or the key was not agreed (the caller then uses a deterministic
    estimate, never a rank-local measurement)."""
    agreement = _CURRENT.get()
    if agreement is None or agreement.profile_ms is None or key is None:
        return None
    return agreement.profile_ms.get(key)


def profile_agreed() -> bool:
    """Whether 'profile' times are agreed in the running partition (no local measurement)."""
    agreement = _CURRENT.get()
    return agreement is not None and agreement.profile_ms is not None


def deterministic_limits() -> bool:
    """Whether MILPs must stop on node limits (the same work on every rank) instead of
    wall-clock limits: under a rank agreement."""
    agreement = _CURRENT.get()
    return agreement is not None and agreement.deterministic_limits


# ---- the fingerprint check ------------------------------------------------------------------

def check_saved_agreement(saved: Sequence[fx.Node], config: PartitionConfig) -> None:
    """With ``config.check_agreement`` on many ranks: raise PartitionDisagreementError, on
    every rank, when the ranks' saved sets differ (see module doc)."""
    if not (config.check_agreement and multi_rank()):
        return
    names = sorted(node.name for node in saved)
    if _agrees(_hash62("/".join(names))):
        return
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    with _real():
        dist.all_gather_object(gathered, names)
    raise PartitionDisagreementError(_describe_disagreement(gathered, dist.get_rank()))


@contextlib.contextmanager
def _real() -> Iterator[None]:
    from ..fx._compat import real_kernels

    with real_kernels():
        yield


def _describe_disagreement(saved_by_rank: Sequence[Sequence[str]], rank: int) -> str:
    """Every rank that differs from rank 0, with the nodes only one of them saves."""
    first = set(saved_by_rank[0])
    lines = []
    for other, names in enumerate(saved_by_rank[1:], start=1):
        mine = set(names)
        if mine == first:
            continue
        only_first = sorted(first - mine)
        only_other = sorted(mine - first)
        lines.append(f"rank 0 saves {only_first} that rank {other} does not; rank {other} "
                     f"saves {only_other} that rank 0 does not")
    return ("the ranks' partitions differ (check_partition_agreement, seen on rank "
            f"{rank}): " + "; ".join(lines) + ". Every rank must decide the same; with the "
            "'profile' estimator keep agree_partition_across_ranks on")
