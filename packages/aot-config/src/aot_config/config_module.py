"""The config-module machinery: declare flags in a plain module, then install it.

A flag set is an ordinary Python module whose flags are ``Flag(...)`` declarations::

    cse = Flag(True, doc="Apply CSE to the joint graph before partitioning.")
    install_config_module(sys.modules[__name__])

After ``install_config_module`` the module object *is* the config object (its class is replaced
by :class:`ConfigModule`): flags read and write as attributes with type and validator checks, and
the module gains ``patch``, ``to_dict``, ``save_config``, ``load_config``, ``codegen_config``,
``get_hash`` and friends. Only ``Flag`` declarations become flags; functions, constants and
imports in the module stay ordinary attributes.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import inspect
import json
import logging
import os
import pickle
import types
import typing
import unittest
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

log = logging.getLogger(__name__)

__all__ = [
    "BOOL_SPELLINGS",
    "ConfigModule",
    "ConfigPatch",
    "Flag",
    "InertFlagWarning",
    "install_config_module",
    "parse_env_bool",
]

_UNSET: Any = object()

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
        save: ``False`` keeps the flag out of ``save_config`` (values that cannot be pickled).
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
                f"{self.qualified_name} = {value!r} is not valid: expected {self.type_name()}, "
                f"got {type(value).__name__}"
            )
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"{self.qualified_name} = {value!r} is not valid: expected one of "
                f"{', '.join(repr(c) for c in self.choices)}"
            )
        if self.range is not None and value is not None:
            low, high = self.range
            out_of_range = (low is not None and value < low) or (high is not None and value > high)
            if out_of_range or value != value:  # NaN compares false with every bound
                raise ValueError(
                    f"{self.qualified_name} = {value!r} is not valid: expected a number in "
                    f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
                )
        if self.validator is not None:
            problem = self.validator(value)
            if problem:
                raise ValueError(f"{self.qualified_name} = {value!r} is not valid: {problem}")
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
                raise ValueError(f"environment variable {variable}={raw!r}: {error}") from None


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
        f"environment variable {variable}={raw!r} is not a boolean: accepted spellings are "
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
                        f"environment variable {variable}={raw!r} is not a valid "
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


class ConfigModule(types.ModuleType):
    """A module whose ``Flag`` declarations became checked attributes.

    Do not instantiate this directly: call :func:`install_config_module` on a module.
    """

    _flags: dict[str, Flag]
    _aliases: dict[str, str]
    _overrides: dict[str, Any]
    _save_ignore: frozenset[str]

    # ---- attribute access -----------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup (module __dict__, class) failed.
        if name.startswith("__"):
            raise AttributeError(name)
        flags = self.__dict__.get("_flags")
        if flags is None:
            raise AttributeError(name)
        if name in flags:
            return self._value_of(name)
        if name in self._aliases:
            target = self._aliases[name]
            self._warn_alias(name, target)
            return self._value_of(target)
        raise AttributeError(
            f"{self.__name__} has no flag {name!r}{_suggest(name, list(flags) + list(self._aliases))}"
        )

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
        if name in self.__dict__.get("_flags", ()):
            # Deleting a flag resets it to its default.
            self._overrides.pop(name, None)
            return
        super().__delattr__(name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._flags))

    def _value_of(self, name: str) -> Any:
        flag = self._flags[name]
        if flag.forced_by_env:
            return flag.env_forced_value
        if name in self._overrides:
            return self._overrides[name]
        default = flag.effective_default
        if isinstance(default, (list, set, dict)):
            # Hand out a private copy so in-place edits (flags.some_set.add(x)) never alter the
            # declared default; the copy then behaves like a user-set value.
            default = copy.deepcopy(default)
            self._overrides[name] = default
        return default

    def _set_flag(self, name: str, value: Any) -> None:
        flag = self._flags[name]
        value = flag.check(value)
        # Only a real change warns: load_config() of a full snapshot writes inert defaults too.
        if flag.inert and value != flag.default:
            warnings.warn(
                f"{flag.qualified_name} does nothing: {flag.inert}", InertFlagWarning, stacklevel=3
            )
        if flag.forced_by_env and value != flag.env_forced_value:
            warnings.warn(
                f"{flag.qualified_name} is forced to {flag.env_forced_value!r} by the environment "
                f"variable {flag.env_forces}; the new value {value!r} has no effect while it is set",
                UserWarning,
                stacklevel=3,
            )
        self._overrides[name] = value

    def _warn_alias(self, alias: str, target: str) -> None:
        warnings.warn(
            f"{self.__name__}.{alias} is deprecated; use {self.__name__}.{target}",
            DeprecationWarning,
            stacklevel=3,
        )

    def _flag(self, name: str) -> Flag:
        if name in self._aliases:
            name = self._aliases[name]
        try:
            return self._flags[name]
        except KeyError:
            raise AttributeError(
                f"{self.__name__} has no flag {name!r}{_suggest(name, list(self._flags))}"
            ) from None

    # ---- introspection --------------------------------------------------------------------

    def flags(self) -> dict[str, Flag]:
        """Every flag declaration by name (read-only view of the declarations)."""
        return dict(self._flags)

    def is_default(self, name: str) -> bool:
        """Whether ``name`` currently holds its default (environment default included)."""
        flag = self._flag(name)
        return self._value_of(flag.name) == flag.effective_default

    def value_source(self, name: str) -> str:
        """Where ``name``'s value comes from: ``default``, ``env VAR``, ``set`` or ``forced by VAR``."""
        flag = self._flag(name)
        if flag.forced_by_env:
            return f"forced by {flag.env_forces}"
        if flag.name in self._overrides and not self.is_default(flag.name):
            return "set"
        if flag.default_from_env:
            return f"env {flag.env}"
        return "default"

    def get_type(self, name: str) -> Any:
        """The declared type of ``name`` (a class or a typing form)."""
        return self._flag(name).type

    def to_dict(self) -> dict[str, Any]:
        """Current value of every flag (shallow copies of containers)."""
        return {name: copy.copy(self._value_of(name)) for name in self._flags}

    def get_config_copy(self) -> dict[str, Any]:
        """Deep copy of every current value; safe to mutate."""
        return copy.deepcopy({name: self._value_of(name) for name in self._flags})

    # ---- persistence ----------------------------------------------------------------------

    def _saved_names(self) -> list[str]:
        return [
            name
            for name, flag in self._flags.items()
            if flag.save and name not in self._save_ignore
        ]

    def save_config(self) -> bytes:
        """Pickle every savable flag (``save=False`` / ``_save_config_ignore`` are skipped)."""
        return pickle.dumps(
            {name: self._value_of(name) for name in self._saved_names()}, protocol=2
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

    def load_config(self, config: bytes | Mapping[str, Any]) -> None:
        """Apply a ``save_config`` / ``save_config_portable`` result; all-or-nothing.

        Unknown keys or invalid values raise before any flag is changed.
        """
        if isinstance(config, (bytes, bytearray)):
            config = pickle.loads(config)
        if not isinstance(config, Mapping):
            raise TypeError(
                f"{self.__name__}.load_config expects bytes from save_config() or a dict, "
                f"got {type(config).__name__}"
            )
        unknown = [key for key in config if key not in self._flags]
        if unknown:
            hints = "".join(_suggest(key, list(self._flags)) for key in unknown[:1])
            raise ValueError(
                f"{self.__name__}.load_config: unknown flag(s) {', '.join(map(repr, unknown))}"
                f"{hints}"
            )
        checked = {}
        for key, value in config.items():
            flag = self._flags[key]
            if (
                isinstance(value, list)
                and matches_type(set(), flag.type)
                and not matches_type(value, flag.type)
            ):
                value = set(value)  # portable form of a set flag
            checked[key] = flag.check(value)
        for key, value in checked.items():
            self._set_flag(key, value)

    def codegen_config(self) -> str:
        """Python source that reproduces every non-default flag of this module."""
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
        """Digest of every flag that affects compiled code; stable across processes."""
        state = {
            name: canonical(self._value_of(name))
            for name, flag in sorted(self._flags.items())
            if not flag.is_compile_ignored
        }
        payload = json.dumps(state, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).digest()

    # ---- temporary changes ----------------------------------------------------------------

    def patch(
        self, arg1: str | Mapping[str, Any] | None = None, arg2: Any = _UNSET, **changes: Any
    ) -> ConfigPatch:
        """Temporarily change flags: ``patch(cse=False)``, ``patch("cse", False)`` or
        ``patch({"cse": False})``. Works as a context manager, a function decorator and a
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
                raise TypeError("patch(dict) takes no second positional argument")
            merged.update(arg1)
        elif arg1 is not None:
            raise TypeError(
                f"{self.__name__}.patch expects a flag name, a dict or keyword arguments, "
                f"got {type(arg1).__name__}"
            )
        merged.update(changes)
        resolved: dict[str, Any] = {}
        for key, value in merged.items():
            flag = self._flag(key)
            resolved[flag.name] = flag.check(value)
        return ConfigPatch(self, resolved)


class ConfigPatch:
    """Applies a set of flag changes on entry and restores the previous state on exit."""

    def __init__(self, config: ConfigModule, changes: dict[str, Any]) -> None:
        self.config = config
        self.changes = changes
        self._saved: list[dict[str, Any]] = []

    def __enter__(self) -> ConfigPatch:
        overrides = self.config._overrides
        # Remember "was not overridden" too, so is_default() is exact after exit.
        self._saved.append({name: overrides.get(name, _UNSET) for name in self.changes})
        for name, value in self.changes.items():
            self.config._set_flag(name, value)
        return self

    def __exit__(self, *exc_info: object) -> None:
        saved = self._saved.pop()
        overrides = self.config._overrides
        for name, previous in saved.items():
            if previous is _UNSET:
                overrides.pop(name, None)
            else:
                overrides[name] = previous

    def __call__(self, target: Any) -> Any:
        if isinstance(target, type):
            if not issubclass(target, unittest.TestCase):
                raise TypeError(
                    f"patch() can decorate functions and unittest.TestCase classes, "
                    f"not {target.__name__}"
                )
            return self._decorate_test_case(target)
        if not callable(target):
            raise TypeError(f"patch() cannot decorate {target!r}")
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

        test_case.setUp = setUp  # type: ignore[method-assign]
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
    module.__class__ = ConfigModule
    # Write the bookkeeping straight into the module dict, past our __setattr__.
    state = vars(module)
    state["_overrides"] = {}
    state["_aliases"] = aliases
    state["_save_ignore"] = save_ignore
    state["_flags"] = flags
    log.debug("installed %d flags in %s", len(flags), module.__name__)
    return typing.cast(ConfigModule, module)
