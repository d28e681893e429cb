"""The saved form of a config module: what ``save_config`` writes and ``load_config`` reads.

``save_config()`` writes a JSON document (UTF-8 bytes)::

    {"format": "aot_config.save_config", "version": 1, "module": "aot_config.functorch",
     "flags": {"cse": false, "activation_memory_budget": 0.5, ...}}

Inside ``flags`` a value is JSON as-is (``null``, booleans, numbers, strings, arrays for lists);
every other value is an object with exactly one tag::

    {"tuple": [...]}  {"set": [...]}  {"frozenset": [...]}  {"dict": [[key, value], ...]}
    {"object": "module.qualname"}

Reading never executes code from the data: JSON parsing builds plain values, and an
``{"object": ...}`` tag is looked up statically (no import, no ``__getattr__``, no descriptor)
in a module that is *already imported*, and must name a class or function that really lives at
that path. Pickles (torch's ``save_config()`` format, and this package's before the JSON format)
are read only on request, by an unpickler that builds plain values and nothing else.
"""

from __future__ import annotations

import inspect
import io
import json
import math
import pickle
import sys
import types
from typing import Any

__all__ = ["FORMAT", "VERSION", "ConfigLoadError", "decode_saved", "encode_saved"]

FORMAT = "aot_config.save_config"
VERSION = 1

_TAGS = ("tuple", "set", "frozenset", "dict", "object")
# Bounds on what load_config reads: a saved config is a few KiB (every flag of a module), so
# these only stop data that would exhaust memory, the stack or the CPU before it is refused.
MAX_SAVED_BYTES = 4 * 2**20      # the whole document
MAX_DEPTH = 64                   # nesting of arrays and objects
MAX_NUMBER_CHARS = 100           # digits (and sign, point, exponent) of one number
MAX_FLAGS = 10_000               # names in "flags"
_PLAIN = "None, bool, int, float, str, and lists, tuples, sets and dicts of those"
_EXPECTED = (
    "expected bytes from save_config() (a JSON document), a dict of flag values, or, with "
    "allow_pickle=True, a pickled dict of plain values (torch's save_config() format)"
)


class ConfigLoadError(ValueError):
    """``load_config`` was given data it cannot apply; the message names what is wrong."""


# ----------------------------------------------------------------------------------------------
# Writing


def _object_path(value: Any) -> str | None:
    """``module.qualname`` of a class or function defined at module level (nesting through
    classes allowed), else None."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    if not (inspect.isclass(value) or inspect.isroutine(value)):
        return None
    return f"{module}:{qualname}"


def _sort_key(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True)


def encode_value(value: Any, where: str) -> Any:
    """The JSON form of ``value``; ValueError naming ``where`` when it has none."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"float": repr(value)}
        return value
    if isinstance(value, list):
        return [encode_value(item, where) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [encode_value(item, where) for item in value]}
    if isinstance(value, (set, frozenset)):
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        return {tag: sorted((encode_value(item, where) for item in value), key=_sort_key)}
    if isinstance(value, dict):
        pairs = [[encode_value(k, where), encode_value(v, where)] for k, v in value.items()]
        return {"dict": pairs}
    path = _object_path(value)
    if path is not None and resolve_object(path) is value:
        return {"object": path}
    raise ValueError(
        f"{where} = {value!r} has no saved form: save_config() writes {_PLAIN}, and classes "
        f"and functions that can be found by module and name"
    )


def encode_saved(module_name: str, values: dict[str, Any]) -> bytes:
    flags = {name: encode_value(value, f"{module_name}.{name}") for name, value in values.items()}
    document = {"format": FORMAT, "version": VERSION, "module": module_name, "flags": flags}
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


# ----------------------------------------------------------------------------------------------
# Reading


def resolve_object(path: str) -> Any:
    """The class or function at ``module:qualname``, looked up without running any code.

    Returns None when the module is not imported, a name along the way is missing, or the
    object found is not a class or function whose own path is ``path``.
    """
    module_name, _, qualname = path.partition(":")
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType) or not qualname:
        return None
    target: Any = module
    for part in qualname.split("."):
        try:
            target = inspect.getattr_static(target, part)
        except AttributeError:
            return None
        if isinstance(target, (staticmethod, classmethod)):
            target = target.__func__
    if _object_path(target) != path:
        return None
    return target


def decode_value(value: Any, where: str) -> Any:
    """The Python value of a JSON-decoded saved value; ConfigLoadError naming ``where``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode_value(item, where) for item in value]
    if not isinstance(value, dict) or len(value) != 1:
        raise ConfigLoadError(
            f"{where}: {json.dumps(value)[:80]} is not a saved value: expected JSON null, "
            f"boolean, number, string, array, or an object with one key out of "
            f"{', '.join(_TAGS + ('float',))}"
        )
    ((tag, body),) = value.items()
    if tag == "float":
        if body not in ("inf", "-inf", "nan"):
            raise ConfigLoadError(f"{where}: {{'float': {body!r}}} expected 'inf', '-inf' or 'nan'")
        return float(body)
    if tag == "object":
        if not isinstance(body, str):
            raise ConfigLoadError(f"{where}: 'object' expects a 'module:qualname' string")
        resolved = resolve_object(body)
        if resolved is None:
            raise ConfigLoadError(
                f"{where}: {body!r} does not name a class or function in an imported module; "
                f"load_config never imports modules, so import it before loading"
            )
        return resolved
    if tag not in _TAGS:
        raise ConfigLoadError(
            f"{where}: unknown tag {tag!r}: expected one of {', '.join(_TAGS + ('float',))}"
        )
    if not isinstance(body, list):
        raise ConfigLoadError(f"{where}: {tag!r} expects an array, got {type(body).__name__}")
    items = [decode_value(item, where) for item in body]
    try:
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(items)
        if tag == "frozenset":
            return frozenset(items)
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in items):
            raise ConfigLoadError(f"{where}: 'dict' expects an array of [key, value] pairs")
        return {key: item for key, item in items}
    except TypeError as error:  # an unhashable set member or dict key
        raise ConfigLoadError(f"{where}: {tag} {error}") from None


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, strings and numbers, and refuses every other global:
    no constructor, function or ``__reduce__`` of the data's choosing is ever called."""

    _ALLOWED = {
        ("builtins", "set"): set,
        ("__builtin__", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("__builtin__", "frozenset"): frozenset,
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"the pickle refers to {module}.{name}; only plain values ({_PLAIN}) are read"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the pickle uses persistent ids; only plain values are read")


def _unpickle_plain(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


def decode_saved(who: str, module_name: str, data: bytes, *, allow_pickle: bool) -> dict[str, Any]:
    """The flag values in ``data`` (JSON from ``save_config`` or, if allowed, a plain pickle).

    Every problem raises one ConfigLoadError that starts with ``who``.
    """
    if len(data) > MAX_SAVED_BYTES:
        raise ConfigLoadError(
            f"{who}: the data is {len(data)} bytes; a saved config is at most {MAX_SAVED_BYTES} "
            f"bytes (4 MiB)"
        )
    head = data.lstrip()[:1]
    if head == b"{":
        return _decode_json(who, module_name, data)
    looks_pickled = data[:1] == b"\x80"
    if not allow_pickle:
        if looks_pickled:
            raise ConfigLoadError(
                f"{who}: the data is a pickle (torch's save_config() format, or aot_config's "
                f"before save_config() wrote JSON); pickles are read only with "
                f"allow_pickle=True, and then only plain values ({_PLAIN})"
            )
        raise ConfigLoadError(
            f"{who}: the data is neither a save_config() JSON document nor a pickle "
            f"(starts with {bytes(data[:16])!r}); {_EXPECTED}"
        )
    try:
        loaded = _unpickle_plain(data)
    except Exception as error:  # noqa: BLE001 - any failure means the data is bad
        reason = str(error) or type(error).__name__
        if isinstance(error, EOFError):
            reason = "it ends early (truncated?)"
        raise ConfigLoadError(f"{who}: cannot read the pickle: {reason}; {_EXPECTED}") from None
    if not isinstance(loaded, dict) or not all(isinstance(key, str) for key in loaded):
        raise ConfigLoadError(
            f"{who}: the pickle holds a {type(loaded).__name__}, not a dict of flag names to values"
        )
    return loaded


def _decode_json(who: str, module_name: str, data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data.decode("utf-8"), parse_int=_bounded_int,
                              parse_float=_bounded_float)
    except UnicodeDecodeError as error:
        raise ConfigLoadError(f"{who}: the data is not UTF-8 JSON: {error}") from None
    except json.JSONDecodeError as error:
        raise ConfigLoadError(
            f"{who}: the data is not valid JSON ({error}; truncated?); {_EXPECTED}"
        ) from None
    except _NumberTooLong as error:
        raise ConfigLoadError(
            f"{who}: a number in the data has {error.length} characters; at most "
            f"{MAX_NUMBER_CHARS} are read"
        ) from None
    except RecursionError:
        raise ConfigLoadError(_too_deep(who)) from None
    if _depth(document) > MAX_DEPTH:
        raise ConfigLoadError(_too_deep(who))
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ConfigLoadError(
            f'{who}: the JSON is not a save_config() document (no "format": "{FORMAT}"); '
            f"pass a save_config_portable() dict as a dict, not as JSON bytes"
        )
    version = document.get("version")
    if version != VERSION:
        raise ConfigLoadError(
            f"{who}: the document has format version {version!r}; this aot_config reads "
            f"version {VERSION}"
        )
    saved_by = document.get("module")
    if saved_by != module_name:
        raise ConfigLoadError(
            f"{who}: the document was saved by {saved_by!r}; load it into that config module"
        )
    flags = document.get("flags")
    if not isinstance(flags, dict):
        raise ConfigLoadError(f'{who}: "flags" must be an object of flag names to values')
    if len(flags) > MAX_FLAGS:
        raise ConfigLoadError(
            f'{who}: "flags" has {len(flags)} names; a saved config has at most {MAX_FLAGS}'
        )
    return {name: decode_value(value, f"{who}: {name}") for name, value in flags.items()}


class _NumberTooLong(ValueError):
    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _NumberTooLong(len(text))
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _NumberTooLong(len(text))
    return float(text)


def _too_deep(who: str) -> str:
    return (f"{who}: the data nests arrays and objects more than {MAX_DEPTH} deep; a saved "
            f"config nests a few levels")


def _depth(document: Any) -> int:
    """How deep ``document`` nests lists and dicts (iterative: no recursion to exhaust)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            pending += [(item, depth + 1) for item in value]
    return deepest
