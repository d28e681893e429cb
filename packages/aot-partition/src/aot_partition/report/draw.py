"""Pictures: an fx graph as a dot/svg/png file (pydot, extra ``aot-partition[draw]``) and the
memory/recompute Pareto front of a budget sweep (matplotlib, extra ``aot-partition[plot]``)."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch.fx as fx

from ..config import PartitionConfig

log = logging.getLogger(__name__)

__all__ = ["ParetoLike", "draw_graph", "plot_pareto"]


class ParetoLike(Protocol):
    """What ``plot_pareto`` reads of a point (``pareto.ParetoPoint`` has it)."""

    @property
    def memory_ratio(self) -> float: ...

    @property
    def recompute_runtime(self) -> float: ...


def _require(module: str, extra: str, what: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs {module!r}; install it with "
                          f"`pip install 'aot-partition[{extra}]'`") from exc


def draw_graph(graph_module: fx.GraphModule, file_name: str, figname: str = "fx_graph",
               clear_meta: bool = True, prog: str | list[str] | None = None,
               parse_stack_trace: bool = False, dot_graph_shape: str | None = None,
               graph_format: str | None = None) -> str:
    """Write ``graph_module`` as a picture; the extension picks the format (without one:
    ``graph_format``, default the flag ``torch_compile_graph_format`` read now). ``.raw``
    writes dot source without needing graphviz; other formats run graphviz's ``dot`` (or
    ``prog``). Returns the path written."""
    _require("pydot", "draw", "draw_graph")
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    if clear_meta:  # drawing tensor metadata is slow and noisy; draw a meta-free copy
        graph = copy.deepcopy(graph_module.graph)
        graph_module = fx.GraphModule(graph_module, graph)
        for node in graph_module.graph.nodes:
            node.meta = {}
    base, ext = os.path.splitext(file_name)
    if not ext:
        if graph_format is None:
            graph_format = PartitionConfig.from_flags().graph_format
        ext = "." + graph_format
    dot = FxGraphDrawer(graph_module, figname, parse_stack_trace=parse_stack_trace,
                        dot_graph_shape=dot_graph_shape).get_main_dot_graph()
    fmt = ext.lstrip(".")
    write = getattr(dot, "write_" + fmt, None)
    if write is None:
        raise ValueError(f"draw_graph: unknown picture format {fmt!r} (from {file_name!r}); "
                         "valid: raw, dot, svg, png, pdf and the other graphviz formats")
    path = f"{base}{ext}"
    log.info("Writing FX graph to file: %s", path)
    if prog is None:
        write(path)
    else:
        write(path, prog=prog)
    return path


def plot_pareto(points_by_label: Mapping[str, Sequence[ParetoLike]], path: str,
                title: str = "Memory budget: saved activations vs. recompute") -> str:
    """One line per label: x = memory ratio (0 = inputs only, 1 = runtime-optimal),
    y = estimated recompute runtime. Writes ``path`` (PNG) and returns it."""
    matplotlib = _require("matplotlib", "plot", "plot_pareto")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not points_by_label:
        raise ValueError("plot_pareto: no series to plot (points_by_label is empty)")
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for label, points in points_by_label.items():
            pts = sorted(points, key=lambda p: p.memory_ratio)
            ax.plot([p.memory_ratio for p in pts], [p.recompute_runtime for p in pts],
                    marker="o", label=label)
        ax.set_xlabel("saved activation memory (fraction of runtime-optimal)")
        ax.set_ylabel("estimated recompute runtime")
        ax.set_title(title)
        ax.grid(True)
        ax.legend()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
