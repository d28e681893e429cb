"""A CoreGraph from JSON: a file path or the JSON text itself (a list of node dicts, or an
object whose only key is "nodes"), checked like ``CoreGraph.from_dicts``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .graph import MAX_NBYTES, CoreGraph, CoreGraphError

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
        kind = "int" if isinstance(data, _LongInteger) else type(data).__name__
        raise CoreGraphError(f"{where}: a graph is a list of node objects, got {kind}")
    _refuse_long_integers(data, where)
    return CoreGraph.from_dicts(data)


class _LongInteger:
    """An integer literal of more than MAX_INT_DIGITS digits, kept unconverted (int() of
    thousands of digits is slow, and refused past 4,300) until the node and field holding it
    can be named."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


# What a field holding an over-long integer must be, by field (a node's sizes and costs).
_FIELD_RANGES = {
    "nbytes": f"an int from 0 to {MAX_NBYTES} (the bytes of its output)",
    "runtime": "a finite number >= 0",
    "save_cost": "a number >= 0 (math.inf: cannot be saved) or None",
}


def _refuse_long_integers(nodes: list[Any], where: str) -> None:
    """A CoreGraphError naming the node, the field and the valid range for an integer of more
    than MAX_INT_DIGITS digits anywhere in ``nodes``."""
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            digits = _long_integer_digits(node)
            if digits is not None:
                raise CoreGraphError(f"{where}: node {index} holds an integer of {digits} "
                                     f"digits (at most {MAX_INT_DIGITS}); each node is a dict "
                                     "of CoreNode fields")
            continue
        for name, value in node.items():
            digits = _long_integer_digits(value)
            if digits is None:
                continue
            node_id = node.get("id")
            named = f"node {node_id!r}" if isinstance(node_id, str) else f"node {index}"
            held = (f"has {name} of {digits} digits" if isinstance(value, _LongInteger)
                    else f"has an integer of {digits} digits in {name}")
            valid = _FIELD_RANGES.get(name, f"an integer of at most {MAX_INT_DIGITS} digits")
            raise CoreGraphError(f"{where}: {named} {held}; must be {valid}")


def _long_integer_digits(value: Any) -> int | None:
    """The digits of the first over-long integer in ``value`` (nested lists and objects)."""
    if isinstance(value, _LongInteger):
        return value.digits
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) \
        else ()
    for item in items:
        digits = _long_integer_digits(item)
        if digits is not None:
            return digits
    return None


class _LoadError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _LoadError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


def _bounded_int(digits: str) -> int | _LongInteger:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        return _LongInteger(len(digits.lstrip("-")))
    return int(digits)


def dump_core_graph(graph: CoreGraph) -> str:
    """``graph`` as JSON text that ``load_core_graph`` reads back into an equal graph."""
    return json.dumps({"nodes": graph.to_dicts()}, indent=1)
