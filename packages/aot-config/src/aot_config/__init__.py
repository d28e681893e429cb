"""aot_config: typed config modules and the AOTAutograd (functorch) and dynamo flag sets.

``aot_config.functorch`` and ``aot_config.dynamo`` are imported on first access, so importing
this package stays cheap (and never imports torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aot_config.config_module import (
    BOOL_SPELLINGS,
    ConfigLoadError,
    ConfigModule,
    ConfigPatch,
    Flag,
    InertFlagWarning,
    flag,
    install_config_module,
    parse_env_bool,
)

if TYPE_CHECKING:
    from aot_config import dynamo, functorch

__all__ = [
    "BOOL_SPELLINGS",
    "ConfigLoadError",
    "ConfigModule",
    "ConfigPatch",
    "Flag",
    "InertFlagWarning",
    "dynamo",
    "flag",
    "functorch",
    "install_config_module",
    "parse_env_bool",
]

_FLAG_SETS = ("functorch", "dynamo")


def __getattr__(name: str) -> Any:
    if name in _FLAG_SETS:
        return importlib.import_module(f"aot_config.{name}")
    raise AttributeError(f"module 'aot_config' has no attribute {name!r}")
