"""Fixtures for the aot_config tests: state isolation, fresh config modules, subprocess runs."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from aot_config import Flag, dynamo, functorch, install_config_module
from aot_config.config_module import ConfigModule, matches_type
from subprocess_limits import SUBPROCESS_TIMEOUT_S

FLAG_SETS = {"functorch": functorch, "dynamo": dynamo}


@pytest.fixture(autouse=True)
def restore_flag_sets() -> Iterator[None]:
    """Every test starts and ends with the real flag sets untouched."""
    saved = {name: dict(config._overrides) for name, config in FLAG_SETS.items()}
    patches = {name: config._patch_state.get() for name, config in FLAG_SETS.items()}
    hidden = {name: config._hidden.get() for name, config in FLAG_SETS.items()}
    yield
    for name, config in FLAG_SETS.items():
        config._overrides.clear()
        config._overrides.update(saved[name])
        config._patch_state.set(patches[name])
        config._hidden.set(hidden[name])


_counter = iter(range(10**6))


@pytest.fixture
def make_config() -> Callable[..., ConfigModule]:
    """Build a throw-away config module from ``Flag`` declarations (and an optional environ)."""

    def build(environ: Mapping[str, str] | None = None, **declarations: Any) -> ConfigModule:
        module = types.ModuleType(f"scratch_config_{next(_counter)}")
        for name, value in declarations.items():
            setattr(module, name, value)
        return install_config_module(module, environ=environ or {})

    return build


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run Python code in a fresh interpreter with extra environment variables."""

    def run(code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if k not in _all_flag_env_vars()}
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=SUBPROCESS_TIMEOUT_S
        )

    return run


def _all_flag_env_vars() -> set[str]:
    names = set()
    for config in FLAG_SETS.values():
        for flag in config.flags().values():
            names.update(v for v in (flag.env, flag.env_forces) if v)
    return names


class _Sample:
    """An importable class used as a set member in alternative values."""


def sample_function() -> None:
    """An importable function used as a set member in alternative values."""


def _alternative_value(flag: Flag, current: Any) -> Any:
    """A valid value for ``flag`` that differs from ``current``."""
    if flag.choices is not None:
        return next(choice for choice in flag.choices if choice != current)
    if flag.validator is not None and flag.validator(False) is None and current is not False:
        return False  # a flag whose "off" is False beside other forms (activation_token_split)
    if flag.validator is not None and matches_type("x", flag.type) and isinstance(current, bool):
        return not current
    if isinstance(current, bool):
        return not current
    if isinstance(current, int):
        low, high = flag.range or (None, None)
        return current + 1 if high is None or current + 1 <= high else current - 1
    if isinstance(current, float):
        return current / 2 if current else 0.5
    if isinstance(current, str):
        return current + "_other"
    if current is None:  # an optional flag: a value of its declared type (and range)
        low, high = flag.range or (None, None)
        return next(value for value in ("other", 1024, 0.5) if matches_type(value, flag.type)
                    and (isinstance(value, str) or ((low is None or value >= low)
                                                    and (high is None or value <= high))))
    if isinstance(current, set):
        for member in ("member", _Sample, sample_function):
            if matches_type({member}, flag.type):
                return current | {member}
    if isinstance(current, list):
        return [*current, "member"]
    if isinstance(current, dict):
        return {**current, "key": "value"}
    raise AssertionError(f"no alternative value for {flag.qualified_name} = {current!r}")


@pytest.fixture
def alternative_value() -> Callable[[Flag, Any], Any]:
    """``(flag, current) -> a valid value that differs from current``."""
    return _alternative_value
