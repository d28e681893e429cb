"""Caps that hold at every shape: guards on the shape symbols of a dynamic graph.

Under dynamic shapes one compiled graph serves every shape, but a cap is checked at the shapes
it was traced at. So after a cap chooses a cut, what the cap measures (saved bytes, the
modelled peak) is written as expressions of the shape symbols and each is required to stay
within the cap: ``expression <= cap`` is evaluated on the graph's ShapeEnv, which records it
as a guard. Dynamo checks guards before running a compiled graph; at a shape that would break
the cap the guard fails, Dynamo compiles again at that shape and the partitioner plans for it
(a cut that fits there, or UnreachableMemoryBudgetError naming the least it reaches). Shapes
the guard admits run the cut as planned: the cap holds at every shape that runs.

Unbacked symbols (sizes known only at run time) cannot be guarded: a cap whose measure
depends on one warns (``UnguardedCapWarning``) that it holds only at the traced sizes.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

import sympy
import torch
import torch.fx as fx

log = logging.getLogger(__name__)

__all__ = ["UnguardedCapWarning", "guard_at_most", "shape_hints", "symbolic_shape_env"]


class UnguardedCapWarning(UserWarning):
    """A cap's measure depends on a size known only at run time: it cannot be guarded."""


def symbolic_shape_env(graph: fx.Graph) -> Any:
    """The ShapeEnv of ``graph``'s placeholders when any of their sizes is symbolic, else None."""
    from torch._guards import detect_fake_mode

    values = [n.meta.get("val") for n in graph.find_nodes(op="placeholder")]
    symbolic = any(
        isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
            isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride())))
        for v in values)
    if not symbolic:
        return None
    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    return getattr(mode, "shape_env", None)


def shape_hints(shape_env: Any) -> dict[Any, int]:
    """The traced value of each backed shape symbol (torch 2.13 renamed the table)."""
    if shape_env is None:
        return {}
    table = getattr(shape_env, "backed_var_to_val", None)
    if table is None:
        table = getattr(shape_env, "var_to_val", None)
    return dict(table or {})


def guard_at_most(shape_env: Any, expressions: Iterable[Any], limit: int, what: str
                  ) -> list[str]:
    """Require ``expression <= limit`` at every shape that runs, for each symbolic
    expression: a guard on ``shape_env`` (see the module doc). Returns the guards' text.
    ``what`` names the cap in the warning for unbacked sizes."""
    installed: list[str] = []
    hints = shape_hints(shape_env)
    for expr in expressions:
        if isinstance(expr, int) or not getattr(expr, "free_symbols", None):
            continue
        unbacked = [s for s in expr.free_symbols if s not in hints]
        if unbacked:
            message = (f"{what} depends on sizes known only at run time "
                       f"({', '.join(sorted(map(str, unbacked)))}): it holds at the traced "
                       "sizes but cannot be guarded at others")
            log.warning("%s", message)
            warnings.warn(message, UnguardedCapWarning, stacklevel=3)
            continue
        condition = sympy.Le(expr, limit)
        result = shape_env.evaluate_expr(condition)
        if not bool(result):  # pragma: no cover - the chosen cut fits at the traced shapes
            raise AssertionError(f"{what}: {expr} <= {limit} is false at the traced shapes")
        installed.append(f"{expr} <= {limit}")
        log.info("%s: guarded %s <= %d (a shape that breaks it compiles again)", what, expr,
                 limit)
    return installed
