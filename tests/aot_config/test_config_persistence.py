"""to_dict, get_config_copy, save/load (JSON, pickled and portable) and codegen round trips."""

from __future__ import annotations

import json
import pickle

import pytest
from aot_config import dynamo, functorch

FLAG_SETS = {"functorch": functorch, "dynamo": dynamo}


def test_to_dict_lists_every_flag_with_current_values() -> None:
    functorch.cse = False
    values = functorch.to_dict()
    assert set(values) == set(functorch.flags())
    assert values["cse"] is False
    assert values["activation_memory_budget"] == 1.0
    assert "patch" not in values and "get_optimize_ddp_mode" not in dynamo.to_dict()


def test_get_config_copy_is_detached() -> None:
    snapshot = dynamo.get_config_copy()
    snapshot["allowed_functions_module_string_ignorelist"].add("mine")
    snapshot["traceable_tensor_subclasses"].add(int)
    assert "mine" not in dynamo.allowed_functions_module_string_ignorelist
    assert dynamo.traceable_tensor_subclasses == set()


@pytest.mark.parametrize("set_name", FLAG_SETS)
def test_save_load_round_trip_restores_every_flag(set_name: str, alternative_value) -> None:
    config = FLAG_SETS[set_name]
    saved_names = set(json.loads(config.save_config())["flags"])
    with config.patch(
        {
            name: alternative_value(flag, getattr(config, name))
            for name, flag in config.flags().items()
            if name in saved_names and not flag.inert
        }
    ):
        changed = config.to_dict()
        blob = config.save_config()
    assert isinstance(blob, bytes)
    assert config.to_dict() != changed
    config.load_config(blob)
    assert {k: v for k, v in config.to_dict().items() if k in saved_names} == {
        k: v for k, v in changed.items() if k in saved_names
    }


def test_save_config_skips_save_config_ignore() -> None:
    saved = json.loads(dynamo.save_config())["flags"]
    for name in ("repro_after", "repro_level", "skipfiles_inline_module_allowlist"):
        assert name in dynamo.flags()
        assert name not in saved
    assert "compiled_autograd" in saved


def test_load_config_accepts_a_dict() -> None:
    functorch.load_config({"cse": False, "activation_memory_budget": 0.5})
    assert functorch.cse is False
    assert functorch.activation_memory_budget == 0.5


def test_load_config_rejects_unknown_keys_without_changing_anything() -> None:
    with pytest.raises(
        ValueError, match=r"load_config: unknown flag\(s\) 'csee', 'bogus'; did you mean 'cse'\?"
    ):
        functorch.load_config({"cse": False, "csee": True, "bogus": 1})
    assert functorch.cse is True
    with pytest.raises(ValueError, match="unknown flag"):
        functorch.load_config(pickle.dumps({"no_such_flag": 1}), allow_pickle=True)


def test_load_config_rejects_bad_values_atomically() -> None:
    with pytest.raises(ValueError, match=r"activation_memory_budget = 3.0 is not valid"):
        functorch.load_config({"cse": False, "activation_memory_budget": 3.0})
    assert functorch.cse is True


def test_load_config_rejects_other_types() -> None:
    with pytest.raises(TypeError, match=r"expects bytes from save_config\(\) or a dict, got list"):
        functorch.load_config([("cse", False)])


@pytest.mark.parametrize("set_name", FLAG_SETS)
def test_portable_config_is_json_and_round_trips(set_name: str) -> None:
    config = FLAG_SETS[set_name]
    portable = config.save_config_portable()
    assert all(not name.startswith("_") for name in portable)
    text = json.dumps(portable)
    config.load_config(json.loads(text))
    assert config.save_config_portable() == portable


def test_portable_config_round_trips_sets() -> None:
    dynamo.allowed_functions_module_string_ignorelist = {"b", "a"}
    portable = dynamo.save_config_portable()
    assert portable["allowed_functions_module_string_ignorelist"] == ["a", "b"]
    dynamo.allowed_functions_module_string_ignorelist = set()
    dynamo.load_config(portable)
    assert dynamo.allowed_functions_module_string_ignorelist == {"a", "b"}


def test_portable_config_leaves_out_callables() -> None:
    dynamo.reorderable_logging_functions = {print}
    assert "reorderable_logging_functions" not in dynamo.save_config_portable()


def test_codegen_of_defaults_has_no_assignments() -> None:
    assert functorch.codegen_config() == "import aot_config.functorch\n"


@pytest.mark.parametrize("set_name", FLAG_SETS)
def test_codegen_round_trip_reproduces_every_non_default(set_name: str, alternative_value) -> None:
    config = FLAG_SETS[set_name]
    changes = {
        name: alternative_value(flag, getattr(config, name))
        for name, flag in config.flags().items()
        if not flag.inert
    }
    with config.patch(changes):
        expected = config.to_dict()
        source = config.codegen_config()
    assert "not reproduced" not in source
    assert config.to_dict() != expected
    exec(compile(source, "<codegen>", "exec"), {})
    assert config.to_dict() == expected
    for name in changes:
        assert f"aot_config.{set_name}.{name} = " in source


def test_codegen_imports_classes_and_functions() -> None:
    from collections import OrderedDict

    dynamo.traceable_tensor_subclasses = {OrderedDict}
    source = dynamo.codegen_config()
    assert "import collections\n" in source
    assert "aot_config.dynamo.traceable_tensor_subclasses = {collections.OrderedDict}" in source


def test_codegen_comments_values_it_cannot_rebuild() -> None:
    dynamo.reorderable_logging_functions = {lambda message: None}
    source = dynamo.codegen_config()
    assert (
        "# aot_config.dynamo.reorderable_logging_functions not reproduced: no source form" in source
    )
    exec(compile(source, "<codegen>", "exec"), {})
