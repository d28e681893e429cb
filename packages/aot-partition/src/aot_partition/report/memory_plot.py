"""A picture of a simulated training step's memory (matplotlib, extra ``aot-partition[plot]``).

Live bytes over the step index, stacked by kind (parameters, inputs, saved activations,
temporaries, ...), the forward and backward shaded, the peak marked.
"""

from __future__ import annotations

import logging
import os

from ..memory_models.simulator import KINDS, MemoryTimeline
from .draw import _require

log = logging.getLogger(__name__)

__all__ = ["write_memory_timeline_png"]

_PHASE_COLORS = {"forward": "#e8f0fe", "backward": "#fdf0e6"}


def _phase_spans(timeline: MemoryTimeline) -> list[tuple[str, int, int]]:
    """(phase, first step, last step) for each run of equal phases."""
    spans: list[tuple[str, int, int]] = []
    for i, step in enumerate(timeline.steps):
        if spans and spans[-1][0] == step.phase:
            spans[-1] = (step.phase, spans[-1][1], i)
        else:
            spans.append((step.phase, i, i))
    return spans


def _stacks(timeline: MemoryTimeline) -> dict[str, list[float]]:
    """Per kind present anywhere, its MiB at each step's high-water mark."""
    present = [k for k in KINDS if any(s.high_by_kind.get(k) for s in timeline.steps)]
    return {k: [s.high_by_kind.get(k, 0) / 2**20 for s in timeline.steps] for k in present}


def write_memory_timeline_png(timeline: MemoryTimeline, path: str,
                              title: str | None = None) -> str:
    """Write the timeline as a PNG at ``path`` and return the path."""
    matplotlib = _require("matplotlib", "plot", "write_memory_timeline_png")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not timeline.steps:
        raise ValueError("write_memory_timeline_png: the timeline has no steps")
    x = list(range(len(timeline.steps)))
    fig, ax = plt.subplots(figsize=(10, 5))
    try:
        for phase, first, last in _phase_spans(timeline):
            ax.axvspan(first - 0.5, last + 0.5, color=_PHASE_COLORS.get(phase, "#eeeeee"),
                       zorder=0)
            ax.text((first + last) / 2, 1.0, phase, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=9)
        stacks = _stacks(timeline)
        ax.stackplot(x, *stacks.values(), labels=list(stacks), step="mid", alpha=0.85,
                     zorder=1)
        peak_mib = timeline.peak_bytes / 2**20
        ax.plot([timeline.peak_step], [peak_mib], marker="v", color="red", zorder=3)
        ax.annotate(f"peak {peak_mib:.3f} MiB\n{timeline.peak_phase}: {timeline.peak_node}",
                    (timeline.peak_step, peak_mib), textcoords="offset points", xytext=(5, 5),
                    fontsize=8, color="red")
        ax.set_xlabel("step (node run)")
        ax.set_ylabel("live MiB (high-water mark of each step)")
        ax.set_title(title or "Simulated memory of one training step")
        ax.set_ylim(0, peak_mib * 1.2 or 1)
        ax.legend(loc="upper left", fontsize=8)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    log.info("wrote memory timeline %s", path)
    return path
