"""Plain-text tables for the CLI's results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .train import TrainResult


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned text table; numbers are right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) and rows for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


def format_bytes(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def train_table(results: Sequence[TrainResult]) -> str:
    show_peak = any(r.peak_memory_bytes is not None for r in results)
    show_step_peak = any(r.step_peak_bytes is not None for r in results)
    headers = ["variant", "step 1 (cold compile) s", "step ms", "last loss", "saved activations"]
    if show_step_peak:
        headers += ["step peak (measured)", "step peak (predicted)"]
    if show_peak:
        headers.append("peak CUDA memory")
    headers.append("loss matches eager")
    rows = []
    for r in results:
        if r.refusal is not None:  # the capped row, its cap unreachable: said below
            rows.append([r.variant, *["refused"] * (len(headers) - 2), "-"])
            continue
        row: list[Any] = [r.variant, f"{r.first_step_s:.2f}", f"{r.step_s * 1e3:.2f}",
                          f"{r.final_loss:.6f}", format_bytes(r.saved_bytes)]
        if show_step_peak:
            row += [format_bytes(r.step_peak_bytes), format_bytes(r.predicted_peak_bytes)]
        if show_peak:
            row.append(format_bytes(r.peak_memory_bytes))
        row.append("-" if r.matches_eager is None else ("yes" if r.matches_eager else "NO"))
        rows.append(row)
    refusals = [f"{r.variant}: {r.refusal}" for r in results if r.refusal is not None]
    return "\n".join([format_table(headers, rows), *refusals])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _is_number(value: Any) -> bool:
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
    except ValueError:
        return False
    return True
