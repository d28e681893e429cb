"""The memory-budget Pareto sweep: (budget, recompute runtime, memory ratio) for many budgets.

One ``BudgetSearch`` is prepared per joint graph (the runtime-optimal and aggressive cuts, the
knapsack items and their runtime estimates), then every budget costs one knapsack and one cut.
The partitioner calls ``sweep`` and ``write_pareto_png`` when the flag
``visualize_memory_budget_pareto`` is on; ``memory_budget_pareto`` is the standalone sweep.

In real bytes: ``memory_budget_pareto`` also simulates each budget's cut (``caps.
SimulatedPeak``: the absolute forward+backward peak, inputs and parameters included) and
estimates its recompute from the graphs (``caps.recompute_estimate``); ``score_partition``
scores any partitioner's forward/backward pair the same way (torch's, for a comparison), and
``plot_peak_front`` draws peak (x, bytes) against estimated recompute (y).
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch.fx as fx

from ..budget.candidates import CutCandidate, activation_bytes, candidate
from ..budget.peak import SimulatedPeak
from ..budget.search import BudgetSearch
from ..config import PartitionConfig
from ..costs.cut_runtime import recompute_estimate
from ..costs.estimators import check_estimator
from ..fx.classify import classify
from ..fx.prepare import prepared_joint
from ..memory_models import simulator as memory
from .draw import plot_pareto

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BUDGETS", "ParetoPoint", "PeakPoint", "memory_budget_pareto",
           "plot_pareto", "plot_peak_front", "score_partition", "sweep"]

DEFAULT_BUDGETS = tuple(b / 100 for b in range(100, -1, -5))
_figure_ids = itertools.count()


@dataclass(frozen=True)
class ParetoPoint:
    budget: float              # the requested activation memory budget
    recompute_runtime: float   # estimated runtime of the released (recomputed) banned nodes
    memory_ratio: float        # saved bytes: 0 = the budget-0 cut, 1 = runtime-optimal cut
    saved_bytes: int           # the one measure (caps.activation_bytes of the cut)
    num_saved: int
    # Set when the sweep simulates its cuts (``memory_budget_pareto(simulate=True)``): the
    # absolute simulated forward+backward peak and the graphs' recompute estimate.
    simulated_peak_bytes: int | None = None
    recompute_estimate: float | None = None


@dataclass(frozen=True)
class PeakPoint:
    """Any partitioner's answer at one budget, scored like ours (``score_partition``)."""

    budget: float
    simulated_peak_bytes: int
    recompute_estimate: float
    saved_bytes: int           # the one measure of the forward's saved outputs


class PeakLike(Protocol):
    """What ``plot_peak_front`` reads of a point (ParetoPoint and PeakPoint have it)."""

    @property
    def budget(self) -> float: ...

    @property
    def simulated_peak_bytes(self) -> int | None: ...

    @property
    def recompute_estimate(self) -> float | None: ...


Progress = Callable[[Iterable[float]], Iterable[float]]


def sweep(search: BudgetSearch, budgets: Sequence[float] = DEFAULT_BUDGETS, *,
          peak: SimulatedPeak | None = None, progress: Progress | None = None
          ) -> list[ParetoPoint]:
    """A ParetoPoint for each budget, using an already prepared search.

    Bytes and the memory ratio count what the partition would save in the one measure
    (``caps.activation_bytes``, what its report says); the ratio runs from the budget-0
    answer (0.0) to the runtime-optimal cut (1.0). With
    ``peak`` each cut is also simulated (its ``estimator`` set: its recompute estimated).
    ``progress`` wraps the loop over budgets (a tqdm, say).
    """
    looped = progress(budgets) if progress is not None else budgets
    chosen = [(float(budget), *search.saved_values(budget)) for budget in looped]
    cuts = [_cut(search, saved) for _, saved, _ in chosen]
    low = activation_bytes(search, _cut(search, search.saved_values(0.0)[0]))
    high = activation_bytes(search, _cut(search, search.runtime_optimal))
    span = high - low
    measured = [peak.of(saved) if peak is not None else None for _, saved, _ in chosen]
    points = []
    for (budget, _, runtime), cut, m in zip(chosen, cuts, measured, strict=True):
        nbytes = activation_bytes(search, cut)
        points.append(ParetoPoint(budget, runtime, (nbytes - low) / span if span > 0 else 0.0,
                                  nbytes, len(cut.read), None if m is None else m.peak_bytes,
                                  None if m is None else m.recompute_runtime))
    return points


def _cut(search: BudgetSearch, saved: Sequence[fx.Node]) -> CutCandidate:
    return candidate(search, saved, "pareto", 0)


def memory_budget_pareto(joint_module: fx.GraphModule, joint_inputs: Any = None, *,
                         num_fwd_outputs: int, budgets: Sequence[float] | None = None,
                         solver: str | None = None, config: PartitionConfig | None = None,
                         simulate: bool = True,
                         static_lifetime_input_indices: Sequence[int] | None = None,
                         progress: Progress | None = None) -> list[ParetoPoint]:
    """Sweep ``budgets`` (default 1.0 down to 0.0 by 0.05) on a copy of ``joint_module``.

    The joint graph is cleaned like the partitioner does (DCE, CSE, recompute tags) first. With
    ``simulate`` (default) each point also gets its cut's simulated peak and recompute estimate
    (``static_lifetime_input_indices`` label the parameters). With ``config.visualize_pareto``
    (the flag ``visualize_memory_budget_pareto``) on, the front is also written as a PNG.
    ``config``: the settings of the sweep (default: the flags now).
    """
    del joint_inputs  # accepted for the partition_fn-like signature; shapes come from meta
    config = config if config is not None else PartitionConfig.from_flags()
    # A copy: the recompute-tag cleanup rewrites node annotations.
    with prepared_joint(copy.deepcopy(joint_module), num_fwd_outputs, config=config) as module:
        info = classify(module, num_fwd_outputs, static_lifetime_input_indices)
        search = BudgetSearch.prepare(module.graph, info, solver=solver, config=config)
        static = (None if static_lifetime_input_indices is None
                  else tuple(static_lifetime_input_indices))
        peak = (SimulatedPeak(module, num_fwd_outputs, static, search.estimator)
                if simulate else None)
        points = sweep(search, DEFAULT_BUDGETS if budgets is None else budgets, peak=peak,
                       progress=progress)
    if config.visualize_pareto:
        write_pareto_png(points, search.solver, config.pareto_dir)
    return points


def score_partition(fw: fx.Graph | fx.GraphModule, bw: fx.Graph | fx.GraphModule,
                    budget: float, *, estimator: str | None = None,
                    static_input_indices: Sequence[int] | None = None) -> PeakPoint:
    """Score a forward/backward pair from any partitioner like our sweep's cuts: its simulated
    peak (memory.simulate_partition, absolute) and ``recompute_estimate`` (``estimator``,
    default the flag)."""
    fw_graph = fw.graph if isinstance(fw, fx.GraphModule) else fw
    bw_graph = bw.graph if isinstance(bw, fx.GraphModule) else bw
    timeline = memory.simulate_partition(fw_graph, bw_graph,
                                         static_input_indices=static_input_indices)
    recompute = recompute_estimate(fw_graph, bw_graph, check_estimator(estimator))
    return PeakPoint(float(budget), timeline.peak_bytes, recompute, timeline.saved_bytes)


def write_pareto_png(points: list[ParetoPoint], label: str, folder: str | None = None) -> str:
    """The visualize flag's picture: the peak front when the points were simulated; in
    ``folder`` (``memory_budget_pareto_dir``, created if missing) or the working directory."""
    path = f"memory_budget_pareto_{next(_figure_ids)}.png"
    if folder:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, path)
    if points and all(p.simulated_peak_bytes is not None for p in points):
        plot_peak_front({label: points}, path)
    else:
        plot_pareto({label: points}, path)
    log.warning("Generated Pareto frontier curve at %s", path)
    return path


def format_binary_bytes(nbytes: float) -> str:
    """``nbytes`` with a binary unit, for axis ticks: 512 B, 1.5 KiB, 60 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def plot_peak_front(points_by_label: Mapping[str, Sequence[PeakLike]], path: str | os.PathLike,
                    title: str = "Simulated peak memory vs. estimated recompute",
                    estimator: str | None = None) -> str:
    """One line per label: x = simulated forward+backward peak in bytes (inputs and
    parameters included), y = estimated recompute (``estimator``'s unit), each point marked
    with its budget and joined in budget order. Points without a peak are left out. Writes ``path`` (PNG), returns it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plot_peak_front needs 'matplotlib'; install it with "
                          "`pip install 'aot-partition[plot]'`") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    # Joined in budget order, high to low: the peak need not fall with the budget (recompute
    # adds backward temporaries), and the line shows where it turns back.
    series = {label: sorted((p for p in points if p.simulated_peak_bytes is not None),
                            key=lambda p: -p.budget)
              for label, points in points_by_label.items()}
    if not any(series.values()):
        raise ValueError("plot_peak_front: no simulated points to plot")
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for label, pts in series.items():
            _plot_series(ax, label, pts)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_binary_bytes(x)))
        ax.set_xlabel("simulated peak memory, forward+backward (inputs and parameters included)")
        unit = f" ({estimator})" if estimator else ""
        ax.set_ylabel(f"estimated recompute{unit}")
        ax.set_title(title)
        ax.grid(True)
        ax.legend()
        out = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out


def _plot_series(ax: Any, label: str, pts: Sequence[PeakLike]) -> None:
    if not pts:
        return
    xs = [p.simulated_peak_bytes for p in pts]
    ys = [p.recompute_estimate or 0.0 for p in pts]
    line = ax.plot(xs, ys, marker="o", label=label)[0]
    if len(pts) <= 12:  # budgets as labels only while they stay readable
        for p, x, y in zip(pts, xs, ys):
            ax.annotate(f"{p.budget:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=line.get_color())
