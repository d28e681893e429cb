"""Compilers that run the graph as it is: ``nop``, ``print_compile`` and ``draw_graph_compile``."""

from __future__ import annotations

import functools
import importlib.util
import logging
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


def _draw_and_return(gm: fx.GraphModule, example_inputs: list[Any], *, name: str,
                     clear_meta: bool) -> fx.GraphModule:
    from aot_partition import draw_graph  # lazy: drawing is an optional extra

    print(gm.code)
    log.info("drawing graph to %s", name)
    draw_graph(gm, name, clear_meta=clear_meta)
    return gm


def draw_graph_compile(name: str, clear_meta: bool = True) -> Compiler:
    """A compiler that prints each graph, draws it to ``name`` (with pydot) and runs it unchanged.

    ``clear_meta`` drops node metadata from the picture (smaller, as the seed did). Raises
    ``MissingExtraError`` right away when pydot (the ``draw`` extra) is not installed.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"draw_graph_compile needs a non-empty file name string, got {name!r}")
    _require_pydot()
    return make_boxed_compiler(functools.partial(_draw_and_return, name=name,
                                                 clear_meta=clear_meta))
