"""A CoreGraph from JSON: a file path or the JSON text itself (a list of node dicts, or an
object whose only key is "nodes"), checked like ``CoreGraph.from_dicts``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .graph import CoreGraph, CoreGraphError

__all__ = ["dump_core_graph", "load_core_graph"]


def load_core_graph(source: str | os.PathLike[str]) -> CoreGraph:
    """The graph in ``source``: JSON text (it starts with ``[`` or ``{``) or a file path."""
    if isinstance(source, str) and source.lstrip()[:1] in ("[", "{"):
        text, where = source, "the JSON text"
    elif isinstance(source, (str, os.PathLike)):
        text, where = Path(source).read_text(), os.fspath(source)
    else:
        raise CoreGraphError(f"load_core_graph takes JSON text or a file path, got "
                             f"{type(source).__name__}")
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise CoreGraphError(f"{where} is not valid JSON: {error}") from None
    if isinstance(data, dict):
        if set(data) != {"nodes"}:
            raise CoreGraphError(f"{where}: a graph object has exactly one key, 'nodes'; got "
                                 f"{sorted(data)}")
        data = data["nodes"]
    if not isinstance(data, list):
        raise CoreGraphError(f"{where}: a graph is a list of node objects, got "
                             f"{type(data).__name__}")
    return CoreGraph.from_dicts(data)


def dump_core_graph(graph: CoreGraph) -> str:
    """``graph`` as JSON text that ``load_core_graph`` reads back into an equal graph."""
    return json.dumps({"nodes": graph.to_dicts()}, indent=1)
