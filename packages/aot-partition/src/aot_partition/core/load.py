"""A CoreGraph from JSON: a file path or the JSON text itself (a list of node dicts, or an
object whose only key is "nodes"), checked like ``CoreGraph.from_dicts``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .graph import CoreGraph, CoreGraphError

__all__ = ["dump_core_graph", "load_core_graph"]


# Bounds on what is read: a graph nests a few levels (nodes, a node, its inputs), its numbers
# are sizes and counts, and a file over this size is not a graph someone meant to load.
MAX_DEPTH = 32
MAX_INT_DIGITS = 30
MAX_FILE_BYTES = 1 << 30
_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def load_core_graph(source: str | os.PathLike[str]) -> CoreGraph:
    """The graph in ``source``: JSON text or a file path. Text is JSON when it starts (after an
    optional byte-order mark and blanks) with ``[``, ``{`` or ``"``, or spans lines; anything
    else is a path, which must name a file. Files are read as UTF-8 (a byte-order mark
    accepted). Refused with a CoreGraphError naming the problem: invalid JSON or UTF-8, nesting
    deeper than MAX_DEPTH, an integer of more than MAX_INT_DIGITS digits, a key given twice in
    one object, a file over MAX_FILE_BYTES."""
    if isinstance(source, str):
        stripped = source.lstrip("\ufeff \t\r\n")
        if stripped[:1] in ("[", "{", '"') or "\n" in source:
            return _from_text(stripped, "the JSON text")
        if not source.strip():
            raise CoreGraphError("load_core_graph got empty text: give JSON text or a file path")
    elif not isinstance(source, os.PathLike):
        raise CoreGraphError(f"load_core_graph takes JSON text or a file path, got "
                             f"{type(source).__name__}")
    path = Path(source)
    where = os.fspath(source)
    try:
        if not path.is_file():
            raise CoreGraphError(
                f"{where!r} is not a file{' (it is a folder)' if path.is_dir() else ''}; give a "
                "file path, or JSON text (it starts with [ or {)")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise CoreGraphError(f"{where}: {path.stat().st_size} bytes is over the "
                                 f"{MAX_FILE_BYTES} bytes a graph file may have")
        raw = path.read_bytes()
    except OSError as error:
        raise CoreGraphError(f"cannot read {where}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CoreGraphError(f"{where} is not UTF-8 text: byte {error.start} is "
                             f"{raw[error.start:error.start + 1]!r}") from None
    return _from_text(text, where)


def _from_text(text: str, where: str) -> CoreGraph:
    depth = 0
    for match in _STRUCTURE.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise CoreGraphError(f"{where} nests deeper than {MAX_DEPTH} levels; a graph "
                                     "nests three (nodes, a node, its inputs)")
        elif token in ("]", "}"):
            depth -= 1
    try:
        data: Any = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_bounded_int)
    except json.JSONDecodeError as error:
        raise CoreGraphError(f"{where} is not valid JSON: {error}") from None
    except _LoadError as error:
        raise CoreGraphError(f"{where}: {error}") from None
    if isinstance(data, dict):
        if set(data) != {"nodes"}:
            raise CoreGraphError(f"{where}: a graph object has exactly one key, 'nodes'; got "
                                 f"{sorted(data)}")
        data = data["nodes"]
    if not isinstance(data, list):
        raise CoreGraphError(f"{where}: a graph is a list of node objects, got "
                             f"{type(data).__name__}")
    return CoreGraph.from_dicts(data)


class _LoadError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _LoadError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _LoadError(f"an integer of {len(digits.lstrip('-'))} digits (at most "
                         f"{MAX_INT_DIGITS})")
    return int(digits)


def dump_core_graph(graph: CoreGraph) -> str:
    """``graph`` as JSON text that ``load_core_graph`` reads back into an equal graph."""
    return json.dumps({"nodes": graph.to_dicts()}, indent=1)
