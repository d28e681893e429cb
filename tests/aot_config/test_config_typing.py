"""The typing view of config modules: ``flag()`` declarations and the ``_config_typing`` stub."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

import aot_config
import pytest
from aot_config import ConfigModule, Flag, dynamo, flag, functorch

STUB = Path(aot_config.__file__).parent / "_config_typing.pyi"


def _stub_names() -> set[str]:
    tree = ast.parse(STUB.read_text())
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    exported = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    )
    assert set(exported) == assigned - {"__all__"}
    return set(exported)


def test_stub_declares_every_config_module_method() -> None:
    methods = {
        name
        for name, member in vars(ConfigModule).items()
        if inspect.isfunction(member)
        and not name.startswith("__")
        and (not name.startswith("_") or name == "_make_closure_patcher")
    }
    assert _stub_names() == methods


def test_stub_is_not_importable_at_runtime() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("aot_config._config_typing")


def test_flag_builds_the_same_declaration_as_the_class() -> None:
    def validator(value: object) -> str | None:
        return None

    options = {
        "type": float,
        "doc": "d",
        "env": "A",
        "env_forces": "B",
        "env_parse": float,
        "choices": (0.5, 1.0),
        "range": (0.0, 1.0),
        "validator": validator,
        "compile_ignored": "debug",
        "aliases": ("old",),
        "inert": None,
        "save": False,
    }
    built: object = flag(1.0, **options)
    assert isinstance(built, Flag)
    assert built == Flag(1.0, **options)
    assert set(inspect.signature(flag).parameters) == {
        f.name for f in dataclasses.fields(Flag) if f.init and f.repr
    }


def test_flag_declarations_install_like_flag_objects(
    make_config: Callable[..., ConfigModule],
) -> None:
    config = make_config(ratio=flag(0.5, range=(0.0, 1.0)), name=Flag("x"))
    assert config.ratio == 0.5
    assert config.name == "x"
    assert set(config.flags()) == {"ratio", "name"}


@pytest.mark.parametrize("config", [functorch, dynamo], ids=["functorch", "dynamo"])
def test_flag_sets_annotate_every_flag(config: ConfigModule) -> None:
    annotations = vars(config).get("__annotations__", {})
    assert set(config.flags()) <= set(annotations)
    for name, declaration in config.flags().items():
        if isinstance(declaration.type, type):
            assert annotations[name] == declaration.type.__name__, name
