"""Compilers that run the graph as it is: ``nop``, ``print_compile`` and ``draw_graph_compile``."""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import torch.fx as fx

from .boxed import Compiler, make_boxed_compiler
from .errors import MissingExtraError

log = logging.getLogger(__name__)


@make_boxed_compiler
def nop(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    """Return the graph module unchanged: the reference point for accuracy checks."""
    return gm


@make_boxed_compiler
def print_compile(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    """Print the graph's Python code, then run it unchanged."""
    print(gm.code)
    return gm


def _require_pydot() -> None:
    # find_spec is None both when pydot is absent and when sys.modules["pydot"] is None (blocked).
    try:
        found = importlib.util.find_spec("pydot") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(
            "draw_graph_compile needs pydot, which is not installed; install the optional extra: "
            "pip install 'aot-compilers[draw]' (pydot also needs the graphviz 'dot' program to "
            "write images)"
        )


class _GraphDrawer:
    """Prints and draws each graph it compiles to ``{base}_{k}{ext}``, k counting from 0 in
    compile order (forward, then backward), so the backward does not overwrite the forward."""

    def __init__(self, name: str, clear_meta: bool) -> None:
        self.base, self.ext = os.path.splitext(name)
        self.clear_meta = clear_meta
        self.count = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
        from aot_partition import draw_graph  # lazy: drawing is an optional extra

        file_name = f"{self.base}_{self.count}{self.ext}"
        self.count += 1
        print(gm.code)
        log.info("drawing graph to %s", file_name)
        draw_graph(gm, file_name, clear_meta=self.clear_meta)
        return gm


def draw_graph_compile(name: str, clear_meta: bool = True) -> Compiler:
    """A compiler that prints each graph, draws it with pydot and runs it unchanged.

    The k-th graph compiled goes to ``{base}_{k}{ext}`` of ``name`` (``g.svg`` gives ``g_0.svg``
    for the forward, ``g_1.svg`` for the backward); the extension picks the format, ``.raw``
    writes dot source without graphviz. ``clear_meta`` drops node metadata from the picture.
    Raises ``MissingExtraError`` right away when pydot (the ``draw`` extra) is not installed.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"draw_graph_compile needs a non-empty file name string, got {name!r}")
    _require_pydot()
    return make_boxed_compiler(_GraphDrawer(name, clear_meta))
