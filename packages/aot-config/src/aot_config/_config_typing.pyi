"""What a config module looks like to a type checker: ConfigModule's methods as module functions.

After ``install_config_module`` a flag module's class is a ``ConfigModule`` subclass, so
``functorch.patch(...)`` and friends are bound methods at runtime; type checkers only see the
module's own source. A flag module therefore ends its imports with::

    if TYPE_CHECKING:
        from aot_config._config_typing import *  # noqa: F403

Each name below is the bound method of a ConfigModule, so its signature follows ConfigModule's
automatically. This is a stub only (there is no ``_config_typing.py``): importing it at runtime
fails, by design. torch does the same with ``torch/utils/_config_typing.pyi``.
"""

from aot_config.config_module import ConfigModule

__all__ = [
    "_make_closure_patcher",
    "codegen_config",
    "flags",
    "get_config_copy",
    "get_hash",
    "get_type",
    "is_default",
    "load_config",
    "patch",
    "patched_flags",
    "reset",
    "save_config",
    "save_config_portable",
    "to_dict",
    "value_source",
]

_config: ConfigModule

_make_closure_patcher = _config._make_closure_patcher
codegen_config = _config.codegen_config
flags = _config.flags
get_config_copy = _config.get_config_copy
get_hash = _config.get_hash
get_type = _config.get_type
is_default = _config.is_default
load_config = _config.load_config
patch = _config.patch
patched_flags = _config.patched_flags
reset = _config.reset
save_config = _config.save_config
save_config_portable = _config.save_config_portable
to_dict = _config.to_dict
value_source = _config.value_source
