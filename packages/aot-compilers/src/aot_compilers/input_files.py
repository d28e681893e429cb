"""Reading and writing ``.input`` metadata files without trusting their contents.

A ``.input`` file is a pickle (the format torch's own graph dumper writes) of a list with one
entry per graph input: ``(torch.Tensor, torch.Size, stride tuple, torch.dtype, torch.device)``
for a tensor, ``(int,)``, ``(float,)`` or ``(bool,)`` for a Python scalar. A plain
``pickle.load`` of such a file runs whatever code a crafted file names, so by default the file is
read by ``_MetaUnpickler``, which accepts exactly what that format needs:

* opcodes: scalars, strings, lists, tuples, the memo, globals and calls (``REDUCE``); never
  ``BUILD``, ``NEWOBJ``, ``INST``/``OBJ``, persistent ids, extension codes, dicts or sets, so no
  object can be created by a constructor of the file's choosing or have attributes set;
* globals: ``int``, ``float``, ``bool``, ``torch.Tensor`` (as a value only: a file calling it is
  refused, it would allocate memory of the file's choosing), torch dtypes (``torch.float32``...),
  and ``torch.Size`` and ``torch.device``, which are called only through checks that take lists
  of non-negative ints and ``(type[, index])`` respectively.

Everything else raises ``UntrustedInputError`` naming the function, the file and what it asked
for. ``trusted=True`` opts into plain ``pickle.load`` for files from a trusted source.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import torch

from .errors import GraphDumpError, UntrustedInputError

InputMeta = tuple[Any, ...]

# Every opcode a list of metadata tuples needs, in any pickle protocol (0 to 5).
_ALLOWED_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1",
    "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE",
    "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
    "GLOBAL", "STACK_GLOBAL", "REDUCE",
})
_ALLOWED_TEXT = ("int, float, bool, torch.Tensor, torch.Size, torch.device and torch dtypes "
                 "(torch.float32, ...) in lists and tuples")


class _Refused(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _TensorType:
    """Stands for ``torch.Tensor`` while unpickling: a file may name the type, never call it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _Refused("a call of torch.Tensor (it would allocate memory of the file's choosing)")

    def __repr__(self) -> str:
        return "torch.Tensor"


_TENSOR_TYPE = _TensorType()


def _size(dims: Any) -> torch.Size:
    if not (isinstance(dims, tuple) and all(type(d) is int and d >= 0 for d in dims)):
        raise ValueError(f"torch.Size takes a tuple of non-negative ints here, got {dims!r}")
    return torch.Size(dims)


def _device(*args: Any) -> torch.device:
    if not (1 <= len(args) <= 2 and isinstance(args[0], str)
            and (len(args) == 1 or type(args[1]) is int)):
        raise ValueError(f"torch.device takes (type) or (type, index) here, got {args!r}")
    return torch.device(*args)


class _MetaUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "__builtin__":  # protocols 0 to 2 write Python 2 names (int as long)
            module, name = "builtins", {"long": "int"}.get(name, name)
        if module == "builtins" and name in ("int", "float", "bool"):
            return getattr(builtins, name)
        if module in ("torch", "torch._tensor") and name == "Tensor":
            return _TENSOR_TYPE
        if module == "torch" and name == "Size":
            return _size
        if module == "torch" and name == "device":
            return _device
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _Refused(f"the global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id")


def _restore_tensor_type(value: Any) -> Any:
    if value is _TENSOR_TYPE:
        return torch.Tensor
    if isinstance(value, list):
        return [_restore_tensor_type(v) for v in value]
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        return tuple(_restore_tensor_type(v) for v in value)
    return value


def _untrusted(caller: str, path: Path, what: str) -> UntrustedInputError:
    return UntrustedInputError(
        f"{caller}: refusing to load {path}: it uses {what}, which a graph-dump .input file never "
        f"contains (allowed: {_ALLOWED_TEXT}). If the file comes from a source you trust, call "
        f"{caller}(..., trusted=True) to unpickle it with plain pickle, which can run arbitrary "
        f"code.")


def _safe_loads(data: bytes, caller: str, path: Path) -> Any:
    try:
        for opcode, _, _ in pickletools.genops(data):
            if opcode.name not in _ALLOWED_OPCODES:
                raise _untrusted(caller, path, f"the pickle opcode {opcode.name}")
    except (ValueError, EOFError) as error:  # not a well-formed pickle at all
        raise GraphDumpError(f"{caller}: cannot read input metadata {path}: not a valid pickle "
                             f"({error})") from error
    try:
        value = _MetaUnpickler(io.BytesIO(data)).load()
    except _Refused as refused:
        raise _untrusted(caller, path, refused.what) from None
    except Exception as error:  # a refused call (Tensor type, bad Size/device) or bad data
        raise GraphDumpError(f"{caller}: cannot read input metadata {path}: "
                             f"{type(error).__name__}: {error}") from error
    return _restore_tensor_type(value)


def _check_metas(metas: Any, caller: str, path: Path) -> list[InputMeta]:
    if not isinstance(metas, list):
        raise GraphDumpError(f"{caller}: {path} holds a {type(metas).__name__}, expected a list "
                             f"of input metadata tuples")
    for index, meta in enumerate(metas):
        if isinstance(meta, tuple) and len(meta) == 1:
            if meta[0] not in (int, float, bool):
                raise GraphDumpError(f"{caller}: {path}: input {index} has scalar type "
                                     f"{meta[0]!r}; expected int, float or bool")
        elif isinstance(meta, tuple) and len(meta) == 5:
            _, shape, stride, dtype, device = meta
            ok = (isinstance(shape, tuple) and isinstance(stride, tuple)
                  and len(shape) == len(stride)
                  and all(type(s) is int and s >= 0 for s in (*shape, *stride))
                  and isinstance(dtype, torch.dtype)
                  and isinstance(device, (torch.device, str)))
            if not ok:
                raise GraphDumpError(
                    f"{caller}: {path}: input {index} metadata {meta!r} is not a valid tensor "
                    f"entry (torch.Tensor, shape, stride, dtype, device): shape and stride must be "
                    f"equally long tuples of non-negative ints, dtype a torch.dtype, device a "
                    f"torch.device or string")
        else:
            raise GraphDumpError(f"{caller}: {path}: input {index} metadata {meta!r} is neither "
                                 f"(type,) nor (type, shape, stride, dtype, device)")
    return metas


def load_input_meta(input_data_path: str | os.PathLike[str], *, trusted: bool = False,
                    _caller: str = "load_input_meta") -> list[InputMeta]:
    """The metadata list of a ``.input`` file, loaded safely unless ``trusted=True``.

    Raises ``UntrustedInputError`` (a ``GraphDumpError``) when the file asks for anything a
    ``.input`` file never holds, and ``GraphDumpError`` when it is unreadable or malformed.
    ``trusted=True`` unpickles with plain ``pickle.load``: only for files you trust, since a
    crafted pickle runs arbitrary code when loaded that way.
    """
    path = Path(input_data_path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise GraphDumpError(f"{_caller}: cannot read input metadata {path}: {error}") from error
    if trusted:
        try:
            metas = pickle.loads(data)  # noqa: S301 - explicit opt-in
        except Exception as error:
            raise GraphDumpError(f"{_caller}: cannot read input metadata {path}: "
                                 f"{type(error).__name__}: {error}") from error
    else:
        metas = _safe_loads(data, _caller, path)
    return _check_metas(metas, _caller, path)


def dump_input_meta(metas: list[InputMeta], path: Path) -> None:
    """Write ``metas`` in the ``.input`` format (readable by torch's own ``get_inputs`` too)."""
    with path.open("wb") as f:
        pickle.dump(metas, f)
