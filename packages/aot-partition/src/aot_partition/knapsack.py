"""0-1 knapsack solvers for the activation-memory budget: which banned nodes to keep saved.

Every solver takes ``(memory, runtimes, max_memory)`` (one memory cost and one runtime value per
item, and a capacity) and returns ``(max_runtime, saved_indices, recompute_indices)``: the total
runtime of the saved items (the recompute work they avoid), the indices kept saved, and the
indices left free to be recomputed. ``saved_indices`` are in ascending order.

- ``greedy_knapsack``: by runtime per byte, best first; fast, no optimality guarantee.
- ``dp_knapsack``: the quantized pseudo-polynomial DP (memory scaled by ``QUANTIZATION_SCALE``
  and rounded, as torch does); LP bounds first settle the items whose choice is certain, the
  rest go through a table vectorized with numpy over the capacity axis, storing one decision
  bit per (item, capacity) cell. Large tables switch to a Hirschberg split that keeps
  O(capacity) memory.
- ``ilp_knapsack``: the exact answer with HiGHS (``scipy.optimize.milp``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "KNAPSACK_SOLVERS",
    "QUANTIZATION_SCALE",
    "KnapsackResult",
    "greedy_knapsack",
    "dp_knapsack",
    "dp_knapsack_hirschberg",
    "ilp_knapsack",
    "get_knapsack_solver",
]

KnapsackResult = tuple[float, list[int], list[int]]

# Memory values are scaled by this and rounded to integers for the DP (same as torch's).
QUANTIZATION_SCALE = 10_000
# Above this many bytes of decision table, dp_knapsack uses the O(capacity) Hirschberg variant.
DP_TABLE_BYTES_LIMIT = 256 * 2**20


def _as_arrays(memory: Sequence[float], runtimes: Sequence[float],
               max_memory: float) -> tuple[np.ndarray, np.ndarray]:
    mem = np.asarray(memory, dtype=np.float64).reshape(-1)
    run = np.asarray(runtimes, dtype=np.float64).reshape(-1)
    if mem.shape != run.shape:
        raise ValueError(
            f"memory and runtimes must have the same length, got {mem.size} and {run.size}")
    if not np.isfinite(max_memory):
        raise ValueError(f"max_memory must be a finite number, got {max_memory}")
    if mem.size and (not np.all(np.isfinite(mem)) or mem.min() < 0):
        bad = int(np.flatnonzero(~np.isfinite(mem) | (mem < 0))[0])
        raise ValueError(f"memory[{bad}] = {mem[bad]} must be finite and >= 0")
    if run.size and not np.all(np.isfinite(run)):
        bad = int(np.flatnonzero(~np.isfinite(run))[0])
        raise ValueError(f"runtimes[{bad}] = {run[bad]} must be finite")
    return mem, run


def _split(n: int, saved: np.ndarray | list[int]) -> tuple[list[int], list[int]]:
    keep = np.zeros(n, dtype=bool)
    keep[np.asarray(saved, dtype=np.int64)] = True
    return np.flatnonzero(keep).tolist(), np.flatnonzero(~keep).tolist()


def greedy_knapsack(memory: Sequence[float], runtimes: Sequence[float],
                    max_memory: float) -> KnapsackResult:
    """Take items by descending runtime/memory while they fit; never exceeds ``max_memory``."""
    mem, run = _as_arrays(memory, runtimes, max_memory)
    with np.errstate(divide="ignore", invalid="ignore"):
        density = np.where(mem > 0, run / np.where(mem > 0, mem, 1.0), np.inf)
    # Stable sort on the negated density: ties keep index order, like Python's sorted().
    order = np.argsort(-density, kind="stable")
    used = 0.0
    total = 0.0
    saved: list[int] = []
    for i in order.tolist():
        if used + mem[i] <= max_memory:
            used += mem[i]
            total += run[i]
            saved.append(i)
    saved_sorted, recompute = _split(mem.size, saved)
    return float(total), saved_sorted, recompute


def ilp_knapsack(memory: Sequence[float], runtimes: Sequence[float],
                 max_memory: float) -> KnapsackResult:
    """The exact 0-1 knapsack as a mixed-integer program solved by HiGHS."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    mem, run = _as_arrays(memory, runtimes, max_memory)
    if mem.size == 0:
        return 0.0, [], []
    # HiGHS checks feasibility with an absolute tolerance (1e-7): scale weights to at most 1.
    unit = float(mem.max()) or 1.0
    result = milp(c=-run, constraints=[LinearConstraint(mem.reshape(1, -1) / unit,
                                                        ub=max_memory / unit)],
                  integrality=np.ones_like(run), bounds=Bounds(0, 1))
    if not result.success or result.x is None:
        raise RuntimeError(f"ilp_knapsack: HiGHS found no solution ({result.message})")
    taken = list(np.flatnonzero(result.x > 0.5))
    # Whatever the tolerance let through: drop the least runtime per byte until it fits.
    while taken and mem[taken].sum() > max_memory:
        taken.remove(min(taken, key=lambda i: run[i] / mem[i] if mem[i] > 0 else np.inf))
    saved, recompute = _split(mem.size, taken)
    return float(run[taken].sum()), saved, recompute


def _quantize(mem: np.ndarray, max_memory: float, scale: int) -> tuple[np.ndarray, int]:
    # np.rint rounds half to even like Python's round(), so torch and we agree on every weight.
    return np.rint(mem * scale).astype(np.int64), int(round(max_memory * scale))


def dp_knapsack(memory: Sequence[float], runtimes: Sequence[float], max_memory: float,
                *, scale: int = QUANTIZATION_SCALE,
                table_bytes_limit: int = DP_TABLE_BYTES_LIMIT) -> KnapsackResult:
    """Quantized DP: optimal for the rounded weights; same answer as torch's ``dp_knapsack``.

    Values are accumulated in float32 in item order, as torch does, so ties break the same way.
    Items that bounds prove to be in every optimal choice, or in none, skip the table (see
    ``_fix_items``); the rest go through it. When the decision table (items x capacity bytes,
    before bit packing) would exceed ``table_bytes_limit``, the Hirschberg variant (O(capacity)
    memory, about twice the work) runs instead.
    """
    mem, run = _as_arrays(memory, runtimes, max_memory)
    n = mem.size
    if n == 0:
        return 0.0, [], []
    q_mem, capacity = _quantize(mem, max_memory, scale)
    if capacity < 0:
        return 0.0, [], list(range(n))
    status = _fix_items(q_mem, run, capacity)
    if int((status == 0).sum()) * (capacity + 1) > table_bytes_limit:
        log.debug("dp_knapsack: %d items x %d capacity; using the Hirschberg variant",
                  n, capacity)
        return _hirschberg(q_mem, run, capacity)
    value, saved = _dp_table(q_mem, run.astype(np.float32), status, capacity)
    saved_sorted, recompute = _split(n, saved)
    return value, saved_sorted, recompute


ALWAYS, NEVER, UNDECIDED = 1, -1, 0


def _fix_items(q_mem: np.ndarray, run: np.ndarray, capacity: int) -> np.ndarray:
    """Per item: ALWAYS (in every optimal choice), NEVER (in none) or UNDECIDED.

    The bounds of Dembo and Hammer: with the items sorted by value per weight, the LP
    relaxation fills the capacity greedily and takes a fraction of the first item that no
    longer fits (ratio r). Forcing out an item of ratio r_i > r costs the LP at least
    (r_i - r) * w_i; forcing in one of ratio r_j < r costs at least (r - r_j) * w_j. When
    that drops the LP bound below a choice we already have (the greedy fill), the item's
    fate is settled.

    The DP compares float32 sums, which may be off by (n + 1) float32 roundings each;
    bounds are only trusted beyond that margin, so the items fixed here are fixed in
    torch's float32 DP too, and dropping them changes no comparison it makes.
    """
    n = q_mem.size
    status = np.zeros(n, dtype=np.int8)
    positive = q_mem > 0
    # Negative values and capacity for everything: rare, left to the plain DP.
    if run.min() < 0 or int(q_mem[positive].sum()) <= capacity:
        return status
    items = np.flatnonzero(positive)
    ratios = run[items] / q_mem[items]
    by_ratio = np.argsort(-ratios, kind="stable")
    items, ratios = items[by_ratio], ratios[by_ratio]
    cum_weight = np.cumsum(q_mem[items])
    critical = int(np.searchsorted(cum_weight, capacity, side="right"))  # the first misfit
    prefix_weight = int(cum_weight[critical - 1]) if critical else 0
    prefix_value = float(run[items[:critical]].sum())
    upper = prefix_value + (capacity - prefix_weight) * float(ratios[critical])
    lower = prefix_value + _greedy_fill(q_mem[items[critical:]].tolist(),
                                        run[items[critical:]].tolist(),
                                        capacity - prefix_weight)
    eps = 2.0 * (n + 2) * 2.0**-24
    slack = upper - lower * (1 - eps) / (1 + eps) + 1e-9 * abs(upper)
    loss = np.abs(ratios - ratios[critical]) * q_mem[items]  # LP cost of the flipped choice
    decided = loss > slack
    decided[critical] = False
    status[items[:critical][decided[:critical]]] = ALWAYS
    status[items[critical:][decided[critical:]]] = NEVER
    return status


def _greedy_fill(weights: list[int], values: list[float], room: int) -> float:
    total = 0.0
    for w, v in zip(weights, values):
        if w <= room:
            room -= w
            total += v
    return total


def _dp_table(q_mem: np.ndarray, values: np.ndarray, status: np.ndarray,
              capacity: int) -> tuple[float, list[int]]:
    """(best value, saved items) of the float32 DP over the UNDECIDED items, with every
    ALWAYS item taken and every NEVER item left out.

    ``row[t]`` holds the best value at capacity ``t + taken``, where ``taken`` is the weight
    of the ALWAYS items so far: taking one is then ``row += value``, no shift. Each row is
    computed only from the lowest capacity backtracking can still reach.
    """
    n = q_mem.size
    weights = q_mem.tolist()
    states = status.tolist()
    forced_weight = int(q_mem[status == ALWAYS].sum())
    top = capacity - forced_weight  # the last index of row
    undecided_weight = np.where(status == UNDECIDED, q_mem, 0)
    after = np.concatenate([np.cumsum(undecided_weight[::-1])[::-1][1:], [0]])
    lows = np.maximum(top - after, 0).tolist()
    row = np.zeros(top + 1, dtype=np.float32)
    candidate = np.empty(top + 1, dtype=np.float32)
    decision = np.zeros(top + 1, dtype=bool)
    # Per item: the first index it may change and one bit per index from there on (8x
    # less memory to fault in than bools, 32x less than torch's float rows).
    firsts = [top + 1] * n
    taken: list[np.ndarray | None] = [None] * n
    for i in range(n):
        if states[i] == NEVER:
            continue
        w, low = weights[i], lows[i]
        if states[i] == ALWAYS:
            np.add(row[low:], values[i], out=row[low:])
            continue
        if w > top:
            continue
        if w == 0:
            np.add(row[low:], values[i], out=candidate[low:])
            np.not_equal(candidate[low:], row[low:], out=decision[low:])
            row, candidate = candidate, row  # below `low` neither is read again
            firsts[i], taken[i] = low, np.packbits(decision[low:])
            continue
        first = max(w, low)
        tail = candidate[: top + 1 - first]
        np.add(row[first - w: top + 1 - w], values[i], out=tail)
        changed = decision[: top + 1 - first]
        np.greater(tail, row[first:], out=changed)
        np.maximum(row[first:], tail, out=row[first:])
        firsts[i], taken[i] = first, np.packbits(changed)
    saved: list[int] = []
    t = top
    for i in range(n - 1, -1, -1):
        if states[i] == ALWAYS:
            saved.append(i)  # its weight is already outside the row's index
            continue
        bits, k = taken[i], t - firsts[i]
        if bits is not None and k >= 0 and (bits[k >> 3] >> (7 - (k & 7))) & 1:
            saved.append(i)
            t -= weights[i]
    return float(row[top]), saved


def _best_profile(q_mem: np.ndarray, values: np.ndarray, items: np.ndarray,
                  capacity: int) -> np.ndarray:
    """best[c] = largest total value of a subset of ``items`` with quantized weight <= c."""
    row = np.zeros(capacity + 1, dtype=np.float64)
    for i in items.tolist():
        w = int(q_mem[i])
        if w > capacity:
            continue
        if w == 0:
            row += max(values[i], 0.0)
            continue
        np.maximum(row[w:], row[: capacity + 1 - w] + values[i], out=row[w:])
    return row


def _hirschberg(q_mem: np.ndarray, values: np.ndarray, capacity: int) -> KnapsackResult:
    """Divide and conquer on the item list: split the capacity where both halves do best."""
    saved: list[int] = []
    stack = [(np.arange(q_mem.size), capacity)]
    while stack:
        items, cap = stack.pop()
        if items.size == 0:
            continue
        if items.size == 1:
            i = int(items[0])
            if q_mem[i] <= cap and values[i] > 0:
                saved.append(i)
            continue
        left, right = items[: items.size // 2], items[items.size // 2:]
        best_left = _best_profile(q_mem, values, left, cap)
        best_right = _best_profile(q_mem, values, right, cap)
        split = int(np.argmax(best_left + best_right[::-1]))
        stack.append((right, cap - split))
        stack.append((left, split))
    saved_sorted, recompute = _split(q_mem.size, saved)
    return float(values[saved_sorted].sum()), saved_sorted, recompute


def dp_knapsack_hirschberg(memory: Sequence[float], runtimes: Sequence[float],
                           max_memory: float, *,
                           scale: int = QUANTIZATION_SCALE) -> KnapsackResult:
    """The memory-light quantized DP: O(capacity) memory instead of O(items x capacity)."""
    mem, run = _as_arrays(memory, runtimes, max_memory)
    if mem.size == 0:
        return 0.0, [], []
    q_mem, capacity = _quantize(mem, max_memory, scale)
    if capacity < 0:
        return 0.0, [], list(range(mem.size))
    return _hirschberg(q_mem, run, capacity)


KNAPSACK_SOLVERS = {
    "greedy": greedy_knapsack,
    "dp": dp_knapsack,
    "ilp": ilp_knapsack,
}


def get_knapsack_solver(name: str):
    """The knapsack function for a solver name ("greedy", "dp" or "ilp")."""
    try:
        return KNAPSACK_SOLVERS[name]
    except KeyError:
        raise ValueError(f"Unknown knapsack solver {name!r}; valid: "
                         f"{', '.join(sorted(KNAPSACK_SOLVERS))}") from None
