"""0-1 knapsack solvers for the activation-memory budget: which banned nodes to keep saved.

Every solver takes ``(memory, runtimes, max_memory)`` (one memory cost and one runtime value per
item, and a capacity) and returns ``(max_runtime, saved_indices, recompute_indices)``: the total
runtime of the saved items (the recompute work they avoid), the indices kept saved, and the
indices left free to be recomputed. ``saved_indices`` are in ascending order.

Every solver's saved set fits: its memory, summed exactly (no float rounding, no quantization),
is at most ``max_memory``. A negative ``max_memory`` saves nothing (every item is recomputed).

- ``greedy_knapsack``: by runtime per byte, best first; fast, no optimality guarantee.
- ``dp_knapsack``: the quantized pseudo-polynomial DP (memory scaled by ``QUANTIZATION_SCALE``
  and rounded, as torch does); LP bounds first settle the items whose choice is certain, the
  rest go through a table vectorized with numpy over the capacity axis, storing one decision
  bit per (item, capacity) cell. Large tables switch to a divide-and-conquer variant that keeps
  a few rows instead of the whole table and gives the same answer. When rounding the weights
  lets that answer overflow ``max_memory``, it returns the better of that answer trimmed to
  fit and the DP's on weights rounded up.
- ``ilp_knapsack``: the exact answer with HiGHS (``scipy.optimize.milp``).
"""

from __future__ import annotations

import logging
import math
import numbers
from bisect import bisect_left
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
# Above this many bytes of decision table, dp_knapsack uses the row-checkpointing variant.
DP_TABLE_BYTES_LIMIT = 256 * 2**20
# dp_knapsack_hirschberg: decision bytes (before bit packing) per leaf, in table rows.
_LIGHT_LEAF_ROWS = 64


def _as_arrays(memory: Sequence[float], runtimes: Sequence[float],
               max_memory: float) -> tuple[np.ndarray, np.ndarray, float]:
    mem = np.asarray(memory, dtype=np.float64).reshape(-1)
    run = np.asarray(runtimes, dtype=np.float64).reshape(-1)
    if mem.shape != run.shape:
        raise ValueError(
            f"memory and runtimes must have the same length, got {mem.size} and {run.size}")
    if (isinstance(max_memory, bool) or not isinstance(max_memory, numbers.Real)
            or not math.isfinite(max_memory)):
        raise ValueError(f"max_memory must be a finite number, got {max_memory!r}")
    if mem.size and (not np.all(np.isfinite(mem)) or mem.min() < 0):
        bad = int(np.flatnonzero(~np.isfinite(mem) | (mem < 0))[0])
        raise ValueError(f"memory[{bad}] = {mem[bad]} must be finite and >= 0")
    if run.size and not np.all(np.isfinite(run)):
        bad = int(np.flatnonzero(~np.isfinite(run))[0])
        raise ValueError(f"runtimes[{bad}] = {run[bad]} must be finite")
    return mem, run, float(max_memory)


def _split(n: int, saved: np.ndarray | list[int]) -> tuple[list[int], list[int]]:
    keep = np.zeros(n, dtype=bool)
    keep[np.asarray(saved, dtype=np.int64)] = True
    return np.flatnonzero(keep).tolist(), np.flatnonzero(~keep).tolist()


def _save_nothing(n: int) -> KnapsackResult:
    return 0.0, [], list(range(n))


def _fits(mem: np.ndarray, saved: Sequence[int], max_memory: float) -> bool:
    """Whether the memory of ``saved``, summed exactly, is at most ``max_memory``: fsum is
    correctly rounded, so the sign of its result is the sign of the exact sum."""
    return math.fsum(mem[np.asarray(saved, dtype=np.int64)].tolist() + [-max_memory]) <= 0


def _longest_fitting_prefix(mem: np.ndarray, base: list[int], extra: list[int],
                            max_memory: float) -> int:
    """The largest k such that ``base`` + ``extra[:k]`` fits (``base`` alone must fit)."""
    lo, hi = 0, len(extra)  # base + extra[:lo] fits; the answer is at most hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(mem, base + extra[:mid], max_memory):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fit(mem: np.ndarray, run: np.ndarray, saved: list[int], max_memory: float, *,
         refill: bool) -> list[int]:
    """``saved`` made to fit ``max_memory`` (>= 0), summed exactly: drop the saved items of
    least runtime per byte (ties: the later index first) until it fits; then, if anything was
    dropped or ``refill`` is set, add the unsaved items of positive runtime that still fit,
    best runtime per byte first (ties: the earlier index first). Returns ascending indices.

    Only the checks sum exactly (``_fits``, in a binary search over how many to keep); the
    top-up runs on a float sum, then keeps the longest prefix of its additions that fits."""
    saved = sorted(saved)
    fits = _fits(mem, saved, max_memory)
    if fits and not refill:
        return saved
    with np.errstate(divide="ignore", invalid="ignore"):
        density = np.where(mem > 0, run / np.where(mem > 0, mem, 1.0), np.inf)
    if not fits:
        items = np.asarray(saved, dtype=np.int64)
        # Best first: descending density, ties the earlier index first; keep a prefix.
        best_first = items[np.lexsort((items, -density[items]))].tolist()
        kept = _longest_fitting_prefix(mem, [], best_first, max_memory)
        log.debug("knapsack: dropped %d saved items to fit max_memory=%r",
                  len(saved) - kept, max_memory)
        saved = best_first[:kept]
    keep = np.zeros(mem.size, dtype=bool)
    keep[np.asarray(saved, dtype=np.int64)] = True
    candidates = np.flatnonzero(~keep & (run > 0) & (mem <= max_memory))
    candidates = candidates[np.argsort(-density[candidates], kind="stable")]
    used = math.fsum(mem[keep].tolist())
    added: list[int] = []
    for i, m in zip(candidates.tolist(), mem[candidates].tolist()):
        if used + m <= max_memory:
            used += m
            added.append(i)
    if added and not _fits(mem, saved + added, max_memory):
        added = added[:_longest_fitting_prefix(mem, saved, added, max_memory)]
    return sorted(saved + added)


def greedy_knapsack(memory: Sequence[float], runtimes: Sequence[float],
                    max_memory: float) -> KnapsackResult:
    """Take items by descending runtime/memory while they fit; never exceeds ``max_memory``."""
    mem, run, max_memory = _as_arrays(memory, runtimes, max_memory)
    if max_memory < 0:
        return _save_nothing(mem.size)
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
    # The running sum rounds: the exact sum may still go over by a few ulps.
    fitted = _fit(mem, run, saved, max_memory, refill=False)
    saved_sorted, recompute = _split(mem.size, fitted)
    if len(fitted) != len(saved) or fitted != sorted(saved):
        total = float(run[saved_sorted].sum())
    return float(total), saved_sorted, recompute


def ilp_knapsack(memory: Sequence[float], runtimes: Sequence[float],
                 max_memory: float) -> KnapsackResult:
    """The exact 0-1 knapsack as a mixed-integer program solved by HiGHS."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    mem, run, max_memory = _as_arrays(memory, runtimes, max_memory)
    if mem.size == 0 or max_memory < 0:
        return _save_nothing(mem.size)
    # HiGHS checks feasibility with an absolute tolerance (1e-7): scale weights to at most 1.
    unit = float(mem.max()) or 1.0
    result = milp(c=-run, constraints=[LinearConstraint(mem.reshape(1, -1) / unit,
                                                        ub=max_memory / unit)],
                  integrality=np.ones_like(run), bounds=Bounds(0, 1))
    if not result.success or result.x is None:
        raise RuntimeError(f"ilp_knapsack: HiGHS found no solution ({result.message})")
    # Whatever the tolerance let through: drop the least runtime per byte until it fits (then
    # top up with what still fits).
    taken = _fit(mem, run, np.flatnonzero(result.x > 0.5).tolist(), max_memory, refill=False)
    saved, recompute = _split(mem.size, taken)
    return float(run[saved].sum()), saved, recompute


def dp_knapsack(memory: Sequence[float], runtimes: Sequence[float], max_memory: float,
                *, scale: int = QUANTIZATION_SCALE,
                table_bytes_limit: int = DP_TABLE_BYTES_LIMIT) -> KnapsackResult:
    """Quantized DP: optimal for the rounded weights; torch's ``dp_knapsack`` answer whenever
    that answer fits ``max_memory``.

    Values are accumulated in float32 in item order, as torch does, so ties break the same way.
    Items that bounds prove to be in every optimal choice, or in none, skip the table (see
    ``_fix_items``); the rest go through it. When the decision table (bytes before bit packing)
    would exceed ``table_bytes_limit``, the row-checkpointing variant runs instead (a few rows
    of memory, a leaf table of at most ``table_bytes_limit`` bytes, more work) with the same
    answer: it recomputes the very rows the table holds.

    Rounding moves each weight by up to half a quantum, so the chosen items may weigh more
    than ``max_memory`` (torch returns them anyway). Then the answer is the better (more
    runtime) of two that fit, each made to fit and topped up by ``_fit``: that one, and the
    DP's on weights rounded up with the capacity rounded down (in float64), which cannot
    overflow but for float error in the scaling.
    """
    mem, run, max_memory = _as_arrays(memory, runtimes, max_memory)
    return _dp(mem, run, max_memory, scale, table_bytes_limit, light=False)


def dp_knapsack_hirschberg(memory: Sequence[float], runtimes: Sequence[float],
                           max_memory: float, *,
                           scale: int = QUANTIZATION_SCALE) -> KnapsackResult:
    """``dp_knapsack``'s answer from the memory-light path, whatever the table size.

    Divide and conquer over the items with checkpointed rows: O(capacity x log(items))
    memory instead of O(items x capacity), about log2(items / 64) / 2 extra passes of work.
    """
    mem, run, max_memory = _as_arrays(memory, runtimes, max_memory)
    return _dp(mem, run, max_memory, scale, None, light=True)


def _quantize(mem: np.ndarray, max_memory: float, scale: int) -> tuple[np.ndarray, int]:
    # np.rint rounds half to even like Python's round(), so torch and we agree on every weight.
    return np.rint(mem * scale).astype(np.int64), int(round(max_memory * scale))


def _dp(mem: np.ndarray, run: np.ndarray, max_memory: float, scale: int,
        table_bytes_limit: int | None, light: bool) -> KnapsackResult:
    n = mem.size
    if n == 0 or max_memory < 0:
        return _save_nothing(n)
    q_mem, capacity = _quantize(mem, max_memory, scale)
    value, saved = _solve(q_mem, run.astype(np.float32), run, capacity, 2.0**-24,
                          table_bytes_limit, light)
    if _fits(mem, saved, max_memory):
        saved_sorted, recompute = _split(n, saved)
        return value, saved_sorted, recompute
    log.debug("dp_knapsack: the rounded weights overflow max_memory=%r; solving again with "
              "weights rounded up", max_memory)
    repaired = _fit(mem, run, saved, max_memory, refill=True)
    q_mem = np.ceil(mem * scale).astype(np.int64)
    capacity = math.floor(max_memory * scale)
    _, saved = _solve(q_mem, run, run, capacity, 2.0**-53, table_bytes_limit, light,
                      add_forced=False)
    saved = _fit(mem, run, saved, max_memory, refill=True)
    if math.fsum(run[repaired].tolist()) > math.fsum(run[saved].tolist()):
        saved = repaired
    saved_sorted, recompute = _split(n, saved)
    return float(run[saved_sorted].sum()), saved_sorted, recompute


ALWAYS, NEVER, UNDECIDED = 1, -1, 0


def _fix_items(q_mem: np.ndarray, run: np.ndarray, capacity: int,
               unit_roundoff: float = 2.0**-24) -> np.ndarray:
    """Per item: ALWAYS (in every optimal choice), NEVER (in none) or UNDECIDED.

    The bounds of Dembo and Hammer: with the items sorted by value per weight, the LP
    relaxation fills the capacity greedily and takes a fraction of the first item that no
    longer fits (ratio r). Forcing out an item of ratio r_i > r costs the LP at least
    (r_i - r) * w_i; forcing in one of ratio r_j < r costs at least (r - r_j) * w_j. When
    that drops the LP bound below a choice we already have (the greedy fill), the item's
    fate is settled.

    The DP compares sums in its float type (``unit_roundoff``: 2**-24 for float32), which
    may be off by (n + 1) roundings each; bounds are only trusted beyond that margin, so the
    items fixed here are fixed in torch's float32 DP too, and dropping them changes no
    comparison it makes.
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
    eps = 2.0 * (n + 2) * unit_roundoff
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


def _solve(q_mem: np.ndarray, values: np.ndarray, run: np.ndarray, capacity: int,
           unit_roundoff: float, table_bytes_limit: int | None, light: bool, *,
           add_forced: bool = True) -> tuple[float, list[int]]:
    """(best value, saved items) of the DP in ``values``' float type over the UNDECIDED items,
    with every ALWAYS item taken and every NEVER item left out; torch's answer when
    ``values`` is float32 (see ``dp_knapsack``).

    ``row[t]`` holds the best value at capacity ``t + taken``, where ``taken`` is the weight
    of the ALWAYS items so far: taking one is then ``row += value``, no shift. Each row is
    computed only from the lowest capacity backtracking can still reach, and each item keeps
    one decision bit per capacity from the first it may change. Backtracking from the last
    item takes an item where it strictly changed the value, as torch's does.

    The whole table fits ``table_bytes_limit`` (bytes of decisions before packing): one pass,
    then the backtrack. Otherwise (or with ``light``, leaves of ``_LIGHT_LEAF_ROWS`` rows),
    divide and conquer on the items: copy the row before a range, advance it over the first
    half without keeping decisions, solve the second half from there (which tells where the
    backtrack leaves it), then the first half from the copy. Rows are the same whichever way
    they are computed, so the answer is too.

    Without ``add_forced`` the ALWAYS items' values stay out of the row (less work; the same
    choice up to rounding, so not torch's tie-breaking): the value returned is then only
    the undecided items'.
    """
    n = q_mem.size
    status = _fix_items(q_mem, run, capacity, unit_roundoff)
    weights = q_mem.tolist()
    states = status.tolist()
    item_values = list(values)  # numpy scalars of values' dtype
    top = capacity - int(q_mem[status == ALWAYS].sum())  # the last index of row
    undecided = status == UNDECIDED
    undecided_weight = np.where(undecided, q_mem, 0)
    after = np.concatenate([np.cumsum(undecided_weight[::-1])[::-1][1:], [0]])
    low_array = np.maximum(top - after, 0)
    lows = low_array.tolist()
    # Items that keep decisions, and how many (bytes before packing) each keeps.
    active = undecided & (q_mem <= top)
    sizes = np.where(active, top + 1 - np.maximum(q_mem, low_array), 0)
    candidate = np.empty(top + 1, dtype=values.dtype)
    decision = np.zeros(top + 1, dtype=bool)
    # The items that change the row, in order; runs of undecided zero-weight ones (many small
    # items round to 0) go in blocks: where each run ends, by position in ``live``.
    live = np.flatnonzero((status == ALWAYS) & add_forced | active)
    live_items = live.tolist()
    zero_live = undecided[live] & (q_mem[live] == 0)
    breaks = np.append(np.flatnonzero(~zero_live), live.size)
    zero_run_end = breaks[np.searchsorted(breaks, np.arange(live.size))].tolist()
    zero_flags = zero_live.tolist()

    def add_zero_weight_run(items: np.ndarray, row: np.ndarray, record: bool,
                            firsts: dict[int, int], taken: dict[int, np.ndarray]) -> None:
        """``items``, all undecided with weight 0: ``row += value`` each, in order, in blocks
        of rows (``np.add.accumulate`` adds in sequence: the same sums, index by index). One
        is taken where it changes the row at all (float rounding may absorb it). From the
        first item's low: the later ones' may be higher, which only computes entries nothing
        reads."""
        low = lows[int(items[0])]
        length = top + 1 - low
        block_items = max(1, 2**20 // length)
        for start in range(0, items.size, block_items):
            chunk = items[start: start + block_items]
            block = np.empty((chunk.size + 1, length), dtype=values.dtype)
            block[0] = row[low:]
            block[1:] = values[chunk, None]
            block = np.add.accumulate(block, axis=0)
            if record:
                packed = np.packbits(block[1:] != block[:-1], axis=1)
                for k, i in enumerate(chunk.tolist()):
                    firsts[i], taken[i] = low, packed[k]
            row[low:] = block[-1]

    def advance(a: int, b: int, row: np.ndarray, record: bool
                ) -> tuple[dict[int, int], dict[int, np.ndarray], list[int]]:
        """Apply items a..b-1 to ``row`` in place; with ``record``, the decision bits of the
        undecided ones (in item order) and the ALWAYS ones met."""
        firsts: dict[int, int] = {}
        taken: dict[int, np.ndarray] = {}
        forced: list[int] = []
        p, stop = bisect_left(live_items, a), bisect_left(live_items, b)
        while p < stop:
            if zero_flags[p]:
                end = min(zero_run_end[p], stop)
                add_zero_weight_run(live[p:end], row, record, firsts, taken)
                p = end
                continue
            i = live_items[p]
            p += 1
            w, low = weights[i], lows[i]
            if states[i] == ALWAYS:
                np.add(row[low:], item_values[i], out=row[low:])
                forced.append(i)
                continue
            first = max(w, low)
            tail = candidate[: top + 1 - first]
            np.add(row[first - w: top + 1 - w], item_values[i], out=tail)
            if record:
                changed = decision[: top + 1 - first]
                np.greater(tail, row[first:], out=changed)
                firsts[i], taken[i] = first, np.packbits(changed)
            np.maximum(row[first:], tail, out=row[first:])
        return firsts, taken, forced

    saved: list[int] = [] if add_forced else np.flatnonzero(status == ALWAYS).tolist()

    def backtrack(firsts: dict[int, int], taken: dict[int, np.ndarray], forced: list[int],
                  t: int) -> int:
        """Walk the recorded items back from row index t; the row index before them."""
        saved.extend(forced)  # their weight is already outside the row's index
        for i in reversed(firsts):
            bits, k = taken[i], t - firsts[i]
            if k >= 0 and (bits[k >> 3] >> (7 - (k & 7))) & 1:
                saved.append(i)
                t -= weights[i]
        return t

    row = np.zeros(top + 1, dtype=values.dtype)
    table_bytes = int(sizes.sum())
    if light or table_bytes_limit is None:  # dp_knapsack_hirschberg
        leaf_bytes = _LIGHT_LEAF_ROWS * (top + 1)
    else:
        leaf_bytes = table_bytes_limit
    if table_bytes <= leaf_bytes:
        firsts, taken, forced = advance(0, n, row, record=True)
        backtrack(firsts, taken, forced, top)
        return float(row[top]), saved
    log.debug("dp_knapsack: %d items x %d capacity; using the row-checkpointing variant",
              n, capacity)
    size_prefix = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    active_prefix = np.concatenate([[0], np.cumsum(active)]).tolist()
    active_items = np.flatnonzero(active).tolist()
    final_value = [0.0]

    def solve(a: int, b: int, row: np.ndarray, t: int) -> int:
        """Backtrack items b-1..a from row index t, ``row`` being the row before item a
        (consumed); returns the row index before item a."""
        count = active_prefix[b] - active_prefix[a]
        if count <= 1 or size_prefix[b] - size_prefix[a] <= leaf_bytes:
            firsts, taken, forced = advance(a, b, row, record=True)
            if b == n:
                final_value[0] = float(row[top])
            return backtrack(firsts, taken, forced, t)
        middle = active_items[active_prefix[a] + count // 2 - 1] + 1  # both halves active
        middle_row = row.copy()
        advance(a, middle, middle_row, record=False)
        t = solve(middle, b, middle_row, t)
        del middle_row
        return solve(a, middle, row, t)

    solve(0, n, row, top)
    return final_value[0], saved


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
