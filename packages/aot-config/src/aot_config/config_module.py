"""The config-module machinery: declare flags in a plain module, then install it.

A flag set is an ordinary Python module whose flags are ``flag(...)`` declarations::

    cse: bool = flag(True, doc="Apply CSE to the joint graph before partitioning.")
    install_config_module(sys.modules[__name__])

After ``install_config_module`` the module object *is* the config object (its class is replaced
by :class:`ConfigModule`): flags read and write as attributes with type and validator checks, and
the module gains ``patch``, ``to_dict``, ``save_config``, ``load_config``, ``codegen_config``,
``get_hash`` and friends. Only ``Flag`` declarations become flags; functions, constants and
imports in the module stay ordinary attributes.

Typing: :func:`flag` builds the same ``Flag`` as the class does, but type checkers see it return
its default's type, i.e. the type the module attribute has once installed (annotate the
declaration when the default does not say it: ``log_dir: str | None = flag(None, type=...)``).
A flag module adds ``if TYPE_CHECKING: from aot_config._config_typing import *`` so that
checkers also see ``patch``, ``get_hash``, ``save_config`` and the other ConfigModule methods as
module-level functions.
"""

from __future__ import annotations

import contextvars
import copy
import difflib
import functools
import hashlib
import inspect
import json
import logging
import os
import types
import typing
import unittest
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from aot_config.persistence import ConfigLoadError, decode_saved, encode_saved

log = logging.getLogger(__name__)

__all__ = [
    "BOOL_SPELLINGS",
    "ConfigLoadError",
    "ConfigModule",
    "ConfigPatch",
    "Flag",
    "InertFlagWarning",
    "flag",
    "install_config_module",
    "parse_env_bool",
]

_UNSET: Any = object()
_T = TypeVar("_T")

# Every accepted spelling of a boolean in an environment variable, lower-cased.
BOOL_SPELLINGS: dict[str, bool] = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


# A value longer than this (as repr) is shortened in error messages: an environment variable
# or a loaded value can be megabytes long.
_REPR_LIMIT = 200


def _short_repr(value: Any) -> str:
    """``repr(value)``, cut to ``_REPR_LIMIT`` characters with the full length said."""
    text = repr(value)
    if len(text) <= _REPR_LIMIT:
        return text
    return f"{text[:_REPR_LIMIT]}... ({len(text)} characters)"


def _without_value(message: str, value: Any) -> str:
    """A check's message without its ``= <value>`` (the caller names the value itself)."""
    return message.replace(f" = {_short_repr(value)}", "", 1)


class InertFlagWarning(UserWarning):
    """A legacy flag that is still accepted but no longer does anything was set."""


@dataclass
class Flag:
    """Declaration of one flag: its default and everything needed to check and explain it.

    Args:
        default: the value when neither the user nor the environment chose one.
        type: a class, a tuple of classes, or a typing form (``Optional[str]``,
            ``Union[bool, str]``, ``set[str]``). Inferred from ``default`` when omitted.
        doc: one line saying what the flag does.
        env: environment variable that sets the *default* (the user can still override it).
        env_forces: environment variable that *forces* the value (wins over user writes).
        env_parse: converts the raw environment string; defaults to parsing by ``type``.
        choices: the only valid values.
        range: inclusive ``(low, high)`` bounds for numbers; ``None`` for an open side.
        validator: ``value -> error text or None`` for rules the above cannot express.
        compile_ignored: the flag does not change compiled code, so ``get_hash`` skips it.
            A string gives the reason (``"debug"``, ``"runtime_behaviour"``).
        aliases: deprecated old names that forward here with a DeprecationWarning.
        inert: the flag is legacy and does nothing; setting it warns with this text.
        save: ``False`` keeps the flag out of ``save_config`` (values with no saved form).
    """

    default: Any
    type: Any = None
    doc: str = ""
    env: str | None = None
    env_forces: str | None = None
    env_parse: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    range: tuple[float | None, float | None] | None = None
    validator: Callable[[Any], str | None] | None = None
    compile_ignored: bool | str = False
    aliases: tuple[str, ...] = ()
    inert: str | None = None
    save: bool = True
    # Filled in by install_config_module.
    name: str = field(default="", repr=False)
    owner: str = field(default="", repr=False)
    env_default_value: Any = field(default=_UNSET, repr=False)
    env_forced_value: Any = field(default=_UNSET, repr=False)

    def __post_init__(self) -> None:
        if self.type is None:
            if self.default is None:
                raise TypeError("Flag(None) needs an explicit type=, e.g. type=str | None")
            self.type = type(self.default)
        if self.choices is not None:
            self.choices = tuple(self.choices)
        if isinstance(self.aliases, str):
            self.aliases = (self.aliases,)
        else:
            self.aliases = tuple(self.aliases)

    @property
    def qualified_name(self) -> str:
        return f"{self.owner}.{self.name}" if self.owner else self.name

    @property
    def effective_default(self) -> Any:
        """The default after the ``env`` (sets-the-default) variable was applied."""
        if self.default_from_env:
            return self.env_default_value
        return self.default

    @property
    def forced_by_env(self) -> bool:
        return self.env_forced_value is not _UNSET

    @property
    def default_from_env(self) -> bool:
        return self.env_default_value is not _UNSET

    @property
    def is_compile_ignored(self) -> bool:
        return bool(self.compile_ignored)

    def type_name(self) -> str:
        return describe_type(self.type)

    def check(self, value: Any) -> Any:
        """Return ``value`` (ints widened to float for float flags) or raise ValueError."""
        if not matches_type(value, self.type):
            raise ValueError(
                f"{self.qualified_name} = {_short_repr(value)} is not valid: expected "
                f"{self.type_name()}, "
                f"got {type(value).__name__}"
            )
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"{self.qualified_name} = {_short_repr(value)} is not valid: expected one of "
                f"{', '.join(repr(c) for c in self.choices)}"
            )
        if self.range is not None and value is not None:
            low, high = self.range
            out_of_range = (low is not None and value < low) or (high is not None and value > high)
            if out_of_range or value != value:  # NaN compares false with every bound
                raise ValueError(
                    f"{self.qualified_name} = {_short_repr(value)} is not valid: expected a "
                    f"number in "
                    f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
                )
        if self.validator is not None:
            problem = self.validator(value)
            if problem:
                raise ValueError(
                    f"{self.qualified_name} = {_short_repr(value)} is not valid: {problem}"
                )
        members = _type_members(self.type)
        if type(value) is int and float in members and int not in members:
            value = float(value)
        return value

    def read_environment(self, environ: Mapping[str, str]) -> None:
        """Parse and check this flag's environment variables (called once, at install)."""
        for variable, slot in (
            (self.env, "env_default_value"),
            (self.env_forces, "env_forced_value"),
        ):
            if variable is None or variable not in environ:
                continue
            raw = environ[variable]
            parsed = (
                self.env_parse(raw) if self.env_parse else parse_env_value(raw, self.type, variable)
            )
            try:
                setattr(self, slot, self.check(parsed))
            except ValueError as error:
                raise ValueError(
                    f"environment variable {variable}={_short_repr(raw)}: "
                    f"{_without_value(str(error), parsed)}"
                ) from None


def flag(
    default: _T,
    *,
    type: Any = None,
    doc: str = "",
    env: str | None = None,
    env_forces: str | None = None,
    env_parse: Callable[[str], Any] | None = None,
    choices: tuple[Any, ...] | None = None,
    range: tuple[float | None, float | None] | None = None,
    validator: Callable[[Any], str | None] | None = None,
    compile_ignored: bool | str = False,
    aliases: tuple[str, ...] = (),
    inert: str | None = None,
    save: bool = True,
) -> _T:
    """Declare a flag: ``name: T = flag(default, ...)``; the arguments are :class:`Flag`'s.

    Returns a ``Flag`` (which ``install_config_module`` turns into a checked attribute), but is
    typed as returning the default's type: after installation the module attribute *is* the
    value, and this lets type checkers see it that way (torch's ``Config`` does the same). Use
    ``Flag(...)`` itself where the declaration object is wanted.
    """
    declaration = Flag(
        default,
        type=type,
        doc=doc,
        env=env,
        env_forces=env_forces,
        env_parse=env_parse,
        choices=choices,
        range=range,
        validator=validator,
        compile_ignored=compile_ignored,
        aliases=aliases,
        inert=inert,
        save=save,
    )
    return typing.cast(_T, declaration)  # the declaration stands in for the value until install


# ----------------------------------------------------------------------------------------------
# Types and environment parsing


def _type_members(tp: Any) -> tuple[Any, ...]:
    """Split a Union / Optional / tuple-of-classes into its members."""
    if isinstance(tp, tuple):
        return tp
    origin = typing.get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def matches_type(value: Any, tp: Any) -> bool:
    """Shallow runtime check of ``value`` against a class, tuple or typing form."""
    for member in _type_members(tp):
        if member is Any:
            return True
        if member is None or member is type(None):
            if value is None:
                return True
            continue
        origin = typing.get_origin(member) or member
        if origin is Callable or origin is typing.Callable:  # noqa: UP006
            if callable(value):
                return True
            continue
        if not isinstance(origin, type):
            continue
        if isinstance(value, bool) and origin is not bool and origin is not object:
            continue  # True is not a valid int/float setting
        if origin is float and isinstance(value, int):
            return True
        if isinstance(value, origin):
            return True
    return False


def describe_type(tp: Any) -> str:
    names = []
    for member in _type_members(tp):
        if member is None or member is type(None):
            names.append("None")
        elif isinstance(member, type) and not typing.get_args(member):
            names.append(member.__name__)
        else:
            names.append(str(member).replace("typing.", ""))
    return " | ".join(names)


def parse_env_bool(raw: str, variable: str) -> bool:
    """Parse a boolean environment value strictly; anything unrecognised raises ValueError."""
    key = raw.strip().lower()
    if key in BOOL_SPELLINGS:
        return BOOL_SPELLINGS[key]
    raise ValueError(
        f"environment variable {variable}={_short_repr(raw)} is not a boolean: accepted "
        f"spellings are "
        f"{'/'.join(BOOL_SPELLINGS)} (any case)"
    )


def parse_env_value(raw: str, tp: Any, variable: str) -> Any:
    """Parse an environment string by the flag's type; raise ValueError naming the variable."""
    members = [m for m in _type_members(tp) if m is not None and m is not type(None)]
    if bool in members and raw.strip().lower() in BOOL_SPELLINGS:
        return BOOL_SPELLINGS[raw.strip().lower()]
    if members == [bool]:
        return parse_env_bool(raw, variable)
    for number_type in (int, float):
        if number_type in members:
            try:
                return number_type(raw.strip())
            except ValueError:
                if str not in members and (number_type is float or float not in members):
                    raise ValueError(
                        f"environment variable {variable}={_short_repr(raw)} is not a valid "
                        f"{describe_type(tp)}"
                    ) from None
    if str in members or Any in members:
        return raw
    raise ValueError(
        f"environment variable {variable} cannot set a flag of type {describe_type(tp)}"
    )


# ----------------------------------------------------------------------------------------------
# Canonical serialisation (for the hash) and source generation (for codegen_config)


def _object_path(value: Any) -> str | None:
    """``module.qualname`` for importable classes and functions, else None."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    return f"{module}.{qualname}"


def canonical(value: Any) -> Any:
    """A JSON-able form of ``value`` that is identical in every process."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [canonical(v) for v in value]
        return {"set": sorted(items, key=lambda item: json.dumps(item, sort_keys=True))}
    if isinstance(value, dict):
        return {"dict": sorted(([canonical(k), canonical(v)] for k, v in value.items()), key=repr)}
    path = _object_path(value)
    if path is not None:
        return {"object": path}
    return {"repr": repr(value)}


def _source(value: Any, imports: set[str]) -> str:
    """A Python expression that rebuilds ``value``; raise ValueError when there is none."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_source(v, imports) for v in value)
        if isinstance(value, tuple):
            return f"({inner}{',' if len(value) == 1 else ''})"
        return f"[{inner}]"
    if isinstance(value, (set, frozenset)):
        if not value:
            return "set()"
        return "{" + ", ".join(sorted(_source(v, imports) for v in value)) + "}"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{_source(k, imports)}: {_source(v, imports)}" for k, v in value.items())
            + "}"
        )
    path = _object_path(value)
    if path is not None and "." not in value.__qualname__:
        imports.add(value.__module__)
        return path
    raise ValueError(f"no source form for {value!r}")


# ----------------------------------------------------------------------------------------------
# The config object


def _suggest(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# Per-thread patch state. A context (each thread has its own; asyncio tasks get copies) holds a
# tuple of layers, bottom first; a layer is ``(owner, {name: value})`` where ``owner`` is the
# ConfigPatch (or closure-patcher token) that pushed it. ``merged`` is every layer flattened,
# top wins, so a read is one dict lookup. Neither the tuple nor the dicts are ever mutated: a
# change builds a new _PatchState, so a copied context can never see another context's edits.
_Layer = tuple[object, dict[str, Any]]


class _PatchState:
    __slots__ = ("layers", "merged")

    def __init__(self, layers: tuple[_Layer, ...]) -> None:
        self.layers = layers
        merged: dict[str, Any] = {}
        for _, values in layers:
            merged.update(values)
        self.merged = merged


_NO_PATCHES = _PatchState(())
_NOTHING_HIDDEN: frozenset[str] = frozenset()


def _fresh(value: Any) -> Any:
    """A private copy of a mutable container, so in-place edits stay with one holder."""
    if isinstance(value, (list, set, dict)):
        return copy.deepcopy(value)
    return value


class _FlagAttribute:
    """Class-level data descriptor for one flag (or alias) of one config module.

    Reads and writes go through :class:`ConfigModule`'s methods either way; the descriptor
    exists so that tools which look for a data descriptor before deciding how to undo a
    ``setattr`` (pytest's ``monkeypatch`` does) restore the old value by assigning it back.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, module: Any, owner: type | None = None) -> Any:
        if module is None:
            return self
        return ConfigModule.__getattr__(module, self.name)

    def __set__(self, module: Any, value: Any) -> None:
        # Only reached for a Flag declaration (ConfigModule.__setattr__ handles the rest):
        # importlib.reload() re-running the module body.
        vars(module)[self.name] = value

    def __delete__(self, module: Any) -> None:
        try:
            del vars(module)[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __repr__(self) -> str:
        return f"<flag attribute {self.name!r}>"


class ConfigModule(types.ModuleType):
    """A module whose ``Flag`` declarations became checked attributes.

    Do not instantiate this directly: call :func:`install_config_module` on a module.

    Where a flag's value comes from, first match wins: the ``env_forces`` variable; the
    topmost patch active *in this thread* that sets it; the process-wide value (plain
    assignment); the ``env`` variable; the declared default.
    """

    _flags: dict[str, Flag]
    _aliases: dict[str, str]
    _overrides: dict[str, Any]  # process-wide values from plain assignment
    _patch_state: contextvars.ContextVar[_PatchState]
    _hidden: contextvars.ContextVar[frozenset[str]]
    _save_ignore: frozenset[str]

    # ---- attribute access -----------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup (module __dict__, class) failed.
        if name.startswith("__"):
            raise AttributeError(name)
        flags = self.__dict__.get("_flags")
        if flags is None:
            raise AttributeError(name)
        if name in self._aliases:
            target = self._aliases[name]
            self._warn_alias(name, target)
            name = target
        elif name not in flags:
            raise AttributeError(
                f"{self.__name__} has no flag {name!r}"
                f"{_suggest(name, list(flags) + list(self._aliases))}"
            )
        if name in self._hidden.get():
            raise AttributeError(
                f"{self.__name__}.{name} was deleted in this thread (del) and reads as missing "
                f"until it is assigned again, the protocol unittest.mock relies on; to go back "
                f"to the default use {self.__name__}.reset({name!r})"
            )
        return self._value_of(name)

    def __setattr__(self, name: str, value: Any) -> None:
        flags = self.__dict__.get("_flags")
        if flags is None or name.startswith("__") or isinstance(value, Flag):
            # A Flag declaration arrives when importlib.reload() re-runs the module body; it is
            # stored as-is and picked up again by install_config_module at the bottom.
            super().__setattr__(name, value)
            return
        if name in self._aliases:
            target = self._aliases[name]
            self._warn_alias(name, target)
            name = target
        if name in flags:
            self._set_flag(name, value)
            return
        if name in self.__dict__ or name.startswith("_"):
            # Helpers and private module state stay ordinary attributes.
            super().__setattr__(name, value)
            return
        raise AttributeError(
            f"{self.__name__} has no flag {name!r}{_suggest(name, list(flags) + list(self._aliases))}"
        )

    def __delattr__(self, name: str) -> None:
        flags = self.__dict__.get("_flags", {})
        if name in self.__dict__.get("_aliases", {}):
            name = self._aliases[name]
        if name not in flags:
            super().__delattr__(name)
            return
        # As torch's config does (and unittest.mock.patch needs: after delattr it assigns the
        # saved value back only when hasattr() is False): reset where a write would go, and
        # read as missing in this thread until the next assignment.
        self._write({name: _fresh(flags[name].effective_default)}, announce=False)
        self._hidden.set(self._hidden.get() | {name})

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._flags))

    def _value_of(self, name: str) -> Any:
        """The value this thread sees (``del`` does not hide it here)."""
        flag = self._flags[name]
        if flag.forced_by_env:
            return flag.env_forced_value
        patched = self._patch_state.get().merged
        if name in patched:
            return patched[name]
        value = self._overrides.get(name, _UNSET)
        if value is not _UNSET:
            return value
        default = flag.effective_default
        if isinstance(default, (list, set, dict)):
            # Hand out a private copy so in-place edits (flags.some_set.add(x)) never alter the
            # declared default; the copy then behaves like a process-wide value. setdefault
            # makes two threads racing here agree on one copy.
            return self._overrides.setdefault(name, copy.deepcopy(default))
        return default

    def _set_flag(self, name: str, value: Any) -> None:
        self._write({name: self._flags[name].check(value)}, stacklevel=5)

    def _announce(self, name: str, value: Any, stacklevel: int) -> None:
        """Warn when a write is inert or overridden by the environment.

        ``stacklevel`` counts from here to the user's line, as for ``warnings.warn``.
        """
        flag = self._flags[name]
        # Only a real change warns: load_config() of a full snapshot writes inert defaults too.
        if flag.inert and value != flag.default:
            warnings.warn(
                f"{flag.qualified_name} does nothing: {flag.inert}",
                InertFlagWarning,
                stacklevel=stacklevel,
            )
        if flag.forced_by_env and value != flag.env_forced_value:
            warnings.warn(
                f"{flag.qualified_name} is forced to {_short_repr(flag.env_forced_value)} by the "
                f"environment variable {flag.env_forces}; the new value {_short_repr(value)} has "
                "no effect while it is set",
                UserWarning,
                stacklevel=stacklevel,
            )

    def _write(
        self, values: Mapping[str, Any], *, announce: bool = True, stacklevel: int = 4
    ) -> None:
        """Store checked values the way an assignment does.

        A flag patched in this thread is written into the topmost patch that sets it (so the
        write lasts until that patch exits, as in torch); any other flag is written
        process-wide.
        """
        if announce:
            for name, value in values.items():
                self._announce(name, value, stacklevel)
        state = self._patch_state.get()
        layered = [name for name in values if name in state.merged]
        if layered:
            layers = list(state.layers)
            for name in layered:
                for index in range(len(layers) - 1, -1, -1):
                    owner, layer_values = layers[index]
                    if name in layer_values:
                        layers[index] = (owner, {**layer_values, name: values[name]})
                        break
            self._patch_state.set(_PatchState(tuple(layers)))
        # One dict.update: other threads see all of the process-wide writes or none.
        self._overrides.update({k: v for k, v in values.items() if k not in state.merged})
        hidden = self._hidden.get()
        if hidden and not hidden.isdisjoint(values):
            self._hidden.set(hidden.difference(values))

    def _push_patch(self, owner: object, changes: Mapping[str, Any]) -> None:
        values = {name: _fresh(value) for name, value in changes.items()}
        for name, value in values.items():
            self._announce(name, value, 4)
        state = self._patch_state.get()
        self._patch_state.set(_PatchState((*state.layers, (owner, values))))
        hidden = self._hidden.get()
        if hidden and not hidden.isdisjoint(values):
            self._hidden.set(hidden.difference(values))

    def _pop_patch(self, owner: object) -> None:
        layers = self._patch_state.get().layers
        for index in range(len(layers) - 1, -1, -1):
            if layers[index][0] is owner:
                rest = layers[:index] + layers[index + 1 :]
                self._patch_state.set(_PatchState(rest) if rest else _NO_PATCHES)
                return
        raise RuntimeError(
            f"{owner!r} is not active in this thread: patches are per thread (per context), "
            f"so exit a patch in the thread that entered it, once per entry"
        )

    def _warn_alias(self, alias: str, target: str) -> None:
        warnings.warn(
            f"{self.__name__}.{alias} is deprecated; use {self.__name__}.{target}",
            DeprecationWarning,
            stacklevel=3,
        )

    def _flag(self, name: str) -> Flag:
        if not isinstance(name, str):
            raise TypeError(f"{self.__name__}: a flag name must be a str, got {name!r}")
        if name in self._aliases:
            name = self._aliases[name]
        try:
            return self._flags[name]
        except KeyError:
            raise AttributeError(
                f"{self.__name__} has no flag {name!r}{_suggest(name, list(self._flags))}"
            ) from None

    def reset(self, *names: str) -> None:
        """Put ``names`` (every flag when none is given) back to their defaults.

        Writes like an assignment: a flag patched in this thread is reset inside that patch.
        """
        targets = [self._flag(name).name for name in names] if names else list(self._flags)
        self._write(
            {name: _fresh(self._flags[name].effective_default) for name in targets},
            announce=False,
        )

    # ---- introspection --------------------------------------------------------------------

    def flags(self) -> dict[str, Flag]:
        """Every flag declaration by name (read-only view of the declarations)."""
        return dict(self._flags)

    def is_default(self, name: str) -> bool:
        """Whether ``name`` currently holds its default (environment default included)."""
        flag = self._flag(name)
        return self._value_of(flag.name) == flag.effective_default

    def value_source(self, name: str) -> str:
        """Where ``name``'s value comes from: ``default``, ``env VAR``, ``set``, ``patched``
        (by a patch active in this thread) or ``forced by VAR``."""
        flag = self._flag(name)
        if flag.forced_by_env:
            return f"forced by {flag.env_forces}"
        if flag.name in self._patch_state.get().merged:
            return "patched"
        if flag.name in self._overrides and not self.is_default(flag.name):
            return "set"
        if flag.default_from_env:
            return f"env {flag.env}"
        return "default"

    def patched_flags(self) -> dict[str, Any]:
        """The flags patched in this thread and their patched values."""
        return dict(self._patch_state.get().merged)

    def get_type(self, name: str) -> Any:
        """The declared type of ``name`` (a class or a typing form)."""
        return self._flag(name).type

    def to_dict(self) -> dict[str, Any]:
        """Current value of every flag in this thread (shallow copies of containers)."""
        return {name: copy.copy(self._value_of(name)) for name in self._flags}

    def get_config_copy(self) -> dict[str, Any]:
        """Deep copy of every current value in this thread; safe to mutate."""
        return copy.deepcopy({name: self._value_of(name) for name in self._flags})

    # ---- persistence ----------------------------------------------------------------------

    def _saved_names(self) -> list[str]:
        return [
            name
            for name, flag in self._flags.items()
            if flag.save and name not in self._save_ignore
        ]

    def save_config(self) -> bytes:
        """Every savable flag as a JSON document (UTF-8 bytes); see ``aot_config.persistence``.

        ``save=False`` flags and ``_save_config_ignore`` are skipped. A value with no saved
        form (a lambda, an instance) raises ValueError naming the flag.
        """
        return encode_saved(
            self.__name__, {name: self._value_of(name) for name in self._saved_names()}
        )

    def save_config_portable(self) -> dict[str, Any]:
        """A JSON-compatible dict of the public savable flags, for other processes or versions.

        Sets become sorted lists; values with no JSON form (classes, callables) are left out.
        """
        portable: dict[str, Any] = {}
        for name in self._saved_names():
            if name.startswith("_"):
                continue
            value = self._value_of(name)
            if isinstance(value, (set, frozenset)):
                value = sorted(value, key=repr)
            try:
                json.dumps(value)
            except TypeError:
                log.debug("save_config_portable skips %s: no JSON form", name)
                continue
            portable[name] = value
        return portable

    def load_config(
        self,
        config: bytes | bytearray | memoryview | Mapping[str, Any],
        *,
        allow_pickle: bool = False,
        strict: bool = True,
    ) -> None:
        """Apply a ``save_config`` / ``save_config_portable`` result; all-or-nothing.

        ``config`` is the bytes ``save_config()`` wrote (JSON), or a dict of flag values.
        ``allow_pickle=True`` also reads pickles (torch's ``save_config()`` format) with an
        unpickler that builds plain values only. ``strict=False`` skips (with one warning)
        names this module has no flag for, e.g. torch's flags that we do not declare.
        Unknown names (when strict), malformed data and invalid values raise
        :class:`ConfigLoadError` (a ValueError) before any flag is changed. Values are written
        like assignments.
        """
        who = f"{self.__name__}.load_config"
        if isinstance(config, (bytes, bytearray, memoryview)):
            config = decode_saved(who, self.__name__, bytes(config), allow_pickle=allow_pickle)
        if not isinstance(config, Mapping):
            hint = " (for JSON text, pass text.encode())" if isinstance(config, str) else ""
            raise TypeError(
                f"{who} expects bytes from save_config() or a dict, "
                f"got {type(config).__name__}{hint}"
            )
        unknown = [key for key in config if key not in self._flags]
        if unknown and strict:
            shown = ", ".join(_short_repr(name) for name in unknown[:8])
            more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
            hints = _suggest(unknown[0], list(self._flags)) if isinstance(unknown[0], str) else ""
            raise ConfigLoadError(
                f"{who}: unknown flag(s) {shown}{more}{hints} (strict=False skips names this "
                f"module does not declare)"
            )
        checked = {}
        for key, value in config.items():
            if key not in self._flags:
                continue
            flag = self._flags[key]
            if (
                isinstance(value, list)
                and matches_type(set(), flag.type)
                and not matches_type(value, flag.type)
            ):
                value = set(value)  # portable form of a set flag
            try:
                checked[key] = flag.check(value)
            except ValueError as error:
                raise ConfigLoadError(f"{who}: {error}") from None
        if unknown:
            shown = ", ".join(_short_repr(name) for name in unknown[:8])
            more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
            warnings.warn(
                f"{who} skipped {len(unknown)} name(s) with no flag here: {shown}{more}",
                UserWarning,
                stacklevel=2,
            )
        self._write(checked)

    def codegen_config(self) -> str:
        """Python source that reproduces every non-default flag of this module (as this thread
        sees them)."""
        imports: set[str] = set()
        lines: list[str] = []
        for name in self._flags:
            if self.is_default(name):
                continue
            try:
                expression = _source(self._value_of(name), imports)
            except ValueError as error:
                lines.append(f"# {self.__name__}.{name} not reproduced: {error}")
                continue
            lines.append(f"{self.__name__}.{name} = {expression}")
        header = [f"import {module}" for module in sorted(imports | {self.__name__})]
        return "\n".join(header + lines) + "\n"

    def get_hash(self) -> bytes:
        """Digest of every flag that affects compiled code, as this thread sees them; stable
        across processes."""
        state = {
            name: canonical(self._value_of(name))
            for name, flag in sorted(self._flags.items())
            if not flag.is_compile_ignored
        }
        payload = json.dumps(state, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).digest()

    # ---- temporary changes ----------------------------------------------------------------

    def _resolve_changes(self, merged: Mapping[str, Any]) -> dict[str, Any]:
        resolved: dict[str, Any] = {}
        for key, value in merged.items():
            flag = self._flag(key)
            resolved[flag.name] = flag.check(value)
        return resolved

    def patch(
        self, arg1: str | Mapping[str, Any] | None = None, arg2: Any = _UNSET, **changes: Any
    ) -> ConfigPatch:
        """Temporarily change flags in this thread: ``patch(cse=False)``, ``patch("cse", False)``
        or ``patch({"cse": False})``. Works as a context manager, a function decorator and a
        ``unittest.TestCase`` class decorator; values are checked now, not on entry.
        """
        merged: dict[str, Any] = {}
        if isinstance(arg1, str):
            if arg2 is _UNSET:
                raise TypeError(
                    f"{self.__name__}.patch({arg1!r}) needs a value: patch(name, value)"
                )
            merged[arg1] = arg2
        elif isinstance(arg1, Mapping):
            if arg2 is not _UNSET:
                raise TypeError(
                    f"{self.__name__}.patch(dict) takes no second positional argument, got {arg2!r}"
                )
            merged.update(arg1)
        elif arg1 is not None:
            raise TypeError(
                f"{self.__name__}.patch expects a flag name, a dict or keyword arguments, "
                f"got {type(arg1).__name__}"
            )
        merged.update(changes)
        return ConfigPatch(self, self._resolve_changes(merged))

    def _make_closure_patcher(self, **changes: Any) -> Callable[[], Callable[[], None]]:
        """A lighter ``patch`` for hot paths (torch's protocol): ``change = config.
        _make_closure_patcher(cse=False)``, then ``revert = change()`` ... ``revert()``.

        Checked now; each ``change()`` pushes a patch in the calling thread and its
        ``revert()`` removes exactly that patch (calling it again does nothing).
        """
        resolved = self._resolve_changes(changes)

        def change() -> Callable[[], None]:
            token = object()
            self._push_patch(token, resolved)
            done = False

            def revert() -> None:
                nonlocal done
                if not done:
                    self._pop_patch(token)
                    done = True

            return revert

        return change


class ConfigPatch:
    """Applies a set of flag changes in the entering thread until the matching exit.

    Each entry pushes a layer; each exit removes the topmost layer this patch pushed in the
    same thread, wherever it sits, so patches exited out of order still restore exactly.
    """

    def __init__(self, config: ConfigModule, changes: dict[str, Any]) -> None:
        self.config = config
        self.changes = changes

    def __enter__(self) -> ConfigPatch:
        self.config._push_patch(self, self.changes)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.config._pop_patch(self)

    def __call__(self, target: Any) -> Any:
        if isinstance(target, type):
            if not issubclass(target, unittest.TestCase):
                raise TypeError(
                    f"{self.config.__name__}.patch() can decorate functions and "
                    f"unittest.TestCase classes, not {target.__name__}; use it as a context "
                    f"manager inside the methods instead"
                )
            return self._decorate_test_case(target)
        if not callable(target):
            raise TypeError(
                f"{self.config.__name__}.patch() cannot decorate {target!r}: expected a function "
                f"or a unittest.TestCase class"
            )
        if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
            raise TypeError(
                f"{self.config.__name__}.patch() cannot decorate the generator function "
                f"{getattr(target, '__qualname__', target)!r}: the patch would cover only the "
                f"creation of the generator; use `with {self.config.__name__}.patch(...)` in its "
                f"body instead"
            )
        if inspect.iscoroutinefunction(target):

            @functools.wraps(target)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await target(*args, **kwargs)

            return async_wrapper

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return target(*args, **kwargs)

        return wrapper

    def _decorate_test_case(self, test_case: type[unittest.TestCase]) -> type:
        patch = self
        original_setup = test_case.setUp

        # Patch per test so each test sees the change and nothing leaks between tests,
        # even when setUp fails (addCleanup runs regardless).
        def setUp(test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
            patch.__enter__()
            test.addCleanup(patch.__exit__, None, None, None)
            original_setup(test)

        # Replacing a method is the point; mypy also mistypes the slot of a type[...] variable
        # as taking self twice, hence "assignment" as well as "method-assign".
        test_case.setUp = setUp  # type: ignore[method-assign, assignment]
        return test_case

    def __repr__(self) -> str:
        return f"<ConfigPatch {self.config.__name__} {self.changes!r}>"


def _iter_flags(module: types.ModuleType) -> Iterator[tuple[str, Flag]]:
    for name, value in list(vars(module).items()):
        if isinstance(value, Flag):
            yield name, value


def install_config_module(
    module: types.ModuleType, environ: Mapping[str, str] | None = None
) -> ConfigModule:
    """Turn ``module``'s ``Flag`` declarations into checked attributes, in place.

    Calling it again on a reloaded module (``importlib.reload``) re-reads declarations and
    environment and drops earlier writes. Reads each flag's environment variables now (``environ`` defaults to ``os.environ``); a
    malformed value raises ValueError naming the variable. A module-level
    ``_save_config_ignore`` set names flags that ``save_config`` skips. Returns the module.
    """
    if isinstance(module, ConfigModule):
        if not any(True for _ in _iter_flags(module)):
            raise TypeError(f"{module.__name__} is already a config module")
        # importlib.reload(): start over from the fresh declarations, environment re-read.
        log.debug("reinstalling %s after reload", module.__name__)
    environ = os.environ if environ is None else environ
    flags: dict[str, Flag] = {}
    aliases: dict[str, str] = {}
    for name, flag in _iter_flags(module):
        if hasattr(ConfigModule, name):
            raise ValueError(
                f"{module.__name__}.{name}: a flag cannot be named like the config method "
                f"ConfigModule.{name}; pick another name"
            )
        flag.name = name
        flag.owner = module.__name__
        flag.default = flag.check(flag.default)
        flag.read_environment(environ)
        flags[name] = flag
        for alias in flag.aliases:
            if alias in aliases or isinstance(vars(module).get(alias), Flag):
                raise ValueError(f"{module.__name__}: alias {alias!r} is already a flag or alias")
            aliases[alias] = name
        del vars(module)[name]
    save_ignore = frozenset(vars(module).get("_save_config_ignore", ()))
    unknown_ignored = save_ignore - set(flags)
    if unknown_ignored:
        log.debug(
            "%s._save_config_ignore names non-flags: %s", module.__name__, sorted(unknown_ignored)
        )
    # A class per config module, holding one data descriptor per flag and alias name.
    attributes = {name: _FlagAttribute(name) for name in [*flags, *aliases]}
    module.__class__ = type(
        "ConfigModule",
        (ConfigModule,),
        {
            "__qualname__": f"ConfigModule[{module.__name__}]",
            "__module__": ConfigModule.__module__,
            **attributes,
        },
    )
    # Write the bookkeeping straight into the module dict, past our __setattr__.
    state = vars(module)
    state["_overrides"] = {}
    state["_patch_state"] = contextvars.ContextVar(
        f"{module.__name__}._patch_state", default=_NO_PATCHES
    )
    state["_hidden"] = contextvars.ContextVar(f"{module.__name__}._hidden", default=_NOTHING_HIDDEN)
    state["_aliases"] = aliases
    state["_save_ignore"] = save_ignore
    state["_flags"] = flags
    log.debug("installed %d flags in %s", len(flags), module.__name__)
    return typing.cast(ConfigModule, module)
