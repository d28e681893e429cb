"""Rows of ``a @ x >= lb`` collected one at a time, for the MILPs (``ilp_graph``,
``offload_milp``): each row a few (column, coefficient) entries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["LowerBoundRows"]


class LowerBoundRows:
    """Sparse constraint rows with a lower bound each (upper bound: infinity)."""

    def __init__(self) -> None:
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._vals: list[float] = []
        self._lower: list[float] = []

    def add(self, entries: Iterable[tuple[int, float]], lb: float) -> None:
        """One row: sum of coefficient * x[column] >= ``lb``."""
        row = len(self._lower)
        for col, val in entries:
            self._rows.append(row)
            self._cols.append(col)
            self._vals.append(val)
        self._lower.append(lb)

    def constraint(self, num_vars: int) -> Any:
        """The rows as one scipy ``LinearConstraint`` over ``num_vars`` columns."""
        from scipy.optimize import LinearConstraint
        from scipy.sparse import coo_matrix

        matrix = coo_matrix((self._vals, (self._rows, self._cols)),
                            shape=(len(self._lower), num_vars)).tocsr()
        return LinearConstraint(matrix, lb=np.asarray(self._lower), ub=np.inf)
