"""The peak of a simulated step at every shape: a few polynomials of the shape symbols.

A dynamic graph runs the same buffer events at every shape; only the sizes change. Live bytes
rise through a run of allocations and fall through the frees after it, at every shape (sizes
are never negative), so the peak at any shape is reached at the end of some allocation run:
the steps that allocate and then free, or whose next step allocates nothing. Each such step's
live bytes are a sum of buffer sizes, a polynomial in the symbols; one whose every coefficient
is at most another's (monomials of sizes are never negative) can never be the larger, and is
dropped. What is left is short (one or a few per phase), and the peak at a shape is the
largest of them there: what a cap must hold for at every shape (shape_guards.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy

__all__ = ["dominates", "peak_expressions"]

Terms = dict[Any, Any]  # monomial -> coefficient


def _terms(expr: Any) -> Terms:
    if isinstance(expr, int):
        return {sympy.Integer(1): expr} if expr else {}
    return dict(sympy.expand(expr).as_coefficients_dict())


def dominates(big: Terms, small: Terms) -> bool:
    """Whether ``big`` >= ``small`` at every shape: no coefficient of ``small`` above ``big``'s."""
    return all(coefficient <= big.get(monomial, 0) for monomial, coefficient in small.items())


def peak_expressions(mem: Any, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The candidates for the step's absolute peak at every shape (see the module doc), as
    sympy expressions; empty when no buffer has a symbolic size. ``mem``: simulator.py's
    ``_Memory`` after a step; ``inputs``: its buffers alive before the step."""
    if not any(b.expr is not None for b in mem.buffers):
        return ()
    cache: dict[int, Terms] = {}

    def terms(buf: Any) -> Terms:
        if buf.id not in cache:
            cache[buf.id] = _terms(buf.expr if buf.expr is not None else buf.nbytes)
        return cache[buf.id]

    live: Counter[Any] = Counter()
    for buf in inputs:
        live.update(terms(buf))
    found: list[tuple[int, Terms]] = []  # (hinted bytes, terms) of each run's end
    steps = mem.raw
    total = sum(b.nbytes for b in inputs)
    for index, raw in enumerate(steps):
        for buf in raw.allocated:
            live.update(terms(buf))
        total += sum(b.nbytes for b in raw.allocated)
        next_allocates = index + 1 < len(steps) and bool(steps[index + 1].allocated)
        if raw.allocated and (raw.freed or not next_allocates):
            snapshot = {m: c for m, c in live.items() if c}
            if raw.workspace:
                snapshot[sympy.Integer(1)] = snapshot.get(sympy.Integer(1), 0) + raw.workspace
            found.append((total + raw.workspace, snapshot))
        for buf in raw.freed:
            live.subtract(terms(buf))
        total -= sum(b.nbytes for b in raw.freed)
    kept: list[Terms] = []
    for _, candidate in sorted(found, key=lambda item: -item[0]):
        if not any(dominates(other, candidate) for other in kept):
            kept = [other for other in kept if not dominates(candidate, other)]
            kept.append(candidate)
    return tuple(sympy.Add(*(c * m for m, c in t.items())) for t in kept)
