"""save_config writes JSON; load_config runs no code from its input and names every problem."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import warnings
from collections import OrderedDict
from typing import Any

import pytest
from aot_config import ConfigLoadError, Flag, dynamo, functorch

CALLS: list[str] = []


def record_call(*args: Any) -> None:
    """What a crafted pickle would run; loading must never call it."""
    CALLS.append(repr(args))


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (record_call, ("pwned",))


def crafted_pickle() -> bytes:
    return pickle.dumps({"cse": False, "max_dist_from_bw": _Payload()}, protocol=2)


# ---- the JSON format --------------------------------------------------------------------------


def test_save_config_is_a_json_document() -> None:
    functorch.activation_memory_budget = 0.5
    document = json.loads(functorch.save_config())
    assert document["format"] == "aot_config.save_config"
    assert document["version"] == 1
    assert document["module"] == "aot_config.functorch"
    assert document["flags"]["activation_memory_budget"] == 0.5


def test_every_kind_of_value_round_trips(make_config) -> None:
    config = make_config(
        pair=Flag((1, "a"), type=tuple),
        frozen=Flag(frozenset({"x"}), type=frozenset),
        mapping=Flag({1: ("a", None)}, type=dict),
        numbers=Flag([1, 2.5, True, None], type=list),
        infinite=Flag(math.inf, type=float),
        nan=Flag(1.0, type=float),
        classes=Flag(set(), type=set[type]),
        function=Flag(None, type=Any),
    )
    values = {
        "pair": (2, ("nested", 3)),
        "frozen": frozenset({"y", "z"}),
        "mapping": {1: ("a", None), "two": [{"three"}]},
        "numbers": [0, -1.5, False, None, "s"],
        "infinite": -math.inf,
        "nan": math.nan,
        "classes": {OrderedDict, ConfigLoadError},
        "function": os.path.join,
    }
    config.load_config(values)
    blob = config.save_config()
    config.reset()
    config.load_config(blob)
    loaded = config.to_dict()
    assert math.isnan(loaded.pop("nan"))
    assert loaded == {k: v for k, v in values.items() if k != "nan"}
    assert loaded["function"] is os.path.join


def test_save_config_refuses_values_with_no_saved_form() -> None:
    dynamo.reorderable_logging_functions = {lambda message: None}
    with pytest.raises(
        ValueError,
        match=r"aot_config\.dynamo\.reorderable_logging_functions = .* has no saved form",
    ):
        dynamo.save_config()


def test_object_references_are_resolved_only_in_imported_modules() -> None:
    document = json.loads(dynamo.save_config())
    document["flags"]["traceable_tensor_subclasses"] = {"set": [{"object": "never_imported:X"}]}
    with pytest.raises(ConfigLoadError, match="load_config never imports modules"):
        dynamo.load_config(json.dumps(document).encode())
    # A module attribute that is not a class or function living at that path is refused too.
    document["flags"]["traceable_tensor_subclasses"] = {"set": [{"object": "os:sep"}]}
    with pytest.raises(ConfigLoadError, match="does not name a class or function"):
        dynamo.load_config(json.dumps(document).encode())


# ---- what is refused, and how ------------------------------------------------------------------


def test_crafted_pickle_runs_nothing_by_default() -> None:
    with pytest.raises(ConfigLoadError, match=r"functorch\.load_config: the data is a pickle"):
        functorch.load_config(crafted_pickle())
    assert CALLS == []
    assert functorch.cse is True


def test_crafted_pickle_runs_nothing_with_allow_pickle() -> None:
    with pytest.raises(
        ConfigLoadError, match=r"load_config: cannot read the pickle: .*record_call; only plain"
    ):
        functorch.load_config(crafted_pickle(), allow_pickle=True)
    assert CALLS == []
    assert functorch.cse is True


@pytest.mark.parametrize("cut", [1, 10, -1])
def test_truncated_blobs_name_load_config(cut: int) -> None:
    blob = functorch.save_config()[:cut]
    with pytest.raises(ConfigLoadError, match=r"aot_config\.functorch\.load_config: .*JSON"):
        functorch.load_config(blob)


def test_truncated_pickle_names_load_config() -> None:
    blob = pickle.dumps({"cse": False}, protocol=2)[:-3]
    with pytest.raises(ConfigLoadError, match=r"functorch\.load_config: .*ends early"):
        functorch.load_config(blob, allow_pickle=True)
    with pytest.raises(ConfigLoadError, match="allow_pickle=True"):
        functorch.load_config(blob)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "neither a save_config"),
        (b"garbage", "neither a save_config"),
        (b"\xff{", "neither a save_config"),
        (b'{"cse": false}', "not a save_config\\(\\) document"),
        (b"[1, 2]", "neither a save_config"),
        (b'{"format": "aot_config.save_config", "version": 9}', "format version 9"),
        (
            b'{"format": "aot_config.save_config", "version": 1, "module": "aot_config.dynamo",'
            b' "flags": {}}',
            "saved by 'aot_config.dynamo'",
        ),
        (
            b'{"format": "aot_config.save_config", "version": 1, '
            b'"module": "aot_config.functorch", "flags": []}',
            '"flags" must be an object',
        ),
        (
            b'{"format": "aot_config.save_config", "version": 1, '
            b'"module": "aot_config.functorch", "flags": {"cse": {"eval": "1"}}}',
            "cse: unknown tag 'eval'",
        ),
        (
            b'{"format": "aot_config.save_config", "version": 1, '
            b'"module": "aot_config.functorch", "flags": {"cse": "yes"}}',
            "cse = 'yes' is not valid: expected bool",
        ),
        (
            b'{"format": "aot_config.save_config", "version": 1, '
            b'"module": "aot_config.functorch", "flags": {"csee": true}}',
            "unknown flag\\(s\\) 'csee'; did you mean 'cse'",
        ),
    ],
)
def test_malformed_input_raises_one_error_naming_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(ConfigLoadError, match=r"aot_config\.functorch\.load_config: ") as error:
        functorch.load_config(data)
    assert isinstance(error.value, ValueError)
    assert error.value.__cause__ is None
    assert re.search(message, str(error.value)), str(error.value)
    assert all(functorch.is_default(name) for name in functorch.flags())


def test_wrong_argument_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"got str \(for JSON text, pass text.encode\(\)\)"):
        functorch.load_config(functorch.save_config().decode())
    with pytest.raises(TypeError, match="got int"):
        functorch.load_config(3)


def test_bytearray_and_memoryview_are_accepted() -> None:
    functorch.cse = False
    blob = functorch.save_config()
    functorch.cse = True
    functorch.load_config(memoryview(bytearray(blob)))
    assert functorch.cse is False


# ---- pickles, on request -----------------------------------------------------------------------


def test_plain_pickles_load_with_allow_pickle() -> None:
    legacy = pickle.dumps(
        {"allowed_functions_module_string_ignorelist": {"a", "b"}, "compiled_autograd": True},
        protocol=2,
    )
    dynamo.load_config(legacy, allow_pickle=True)
    assert dynamo.allowed_functions_module_string_ignorelist == {"a", "b"}
    assert dynamo.compiled_autograd is True


def test_pickled_non_dict_is_refused() -> None:
    with pytest.raises(ConfigLoadError, match="the pickle holds a list, not a dict"):
        functorch.load_config(pickle.dumps([1], protocol=2), allow_pickle=True)


@pytest.mark.parametrize("set_name", ["functorch", "dynamo"])
def test_torchs_save_config_is_readable_with_allow_pickle(set_name: str) -> None:
    torch_config = pytest.importorskip(f"torch._{set_name}.config")
    ours = {"functorch": functorch, "dynamo": dynamo}[set_name]
    # Values whose type differs between torch 2.13 and the seed (dynamo.dead_code_elimination is
    # None there, a bool here) are set to ours in torch before saving.
    disagreeing = {}
    for name, value in pickle.loads(torch_config.save_config()).items():
        if name in ours.flags():
            try:
                ours.flags()[name].check(value)
            except ValueError:
                disagreeing[name] = getattr(ours, name)
    # Functions a process added to torch's dynamo.ignore_logging_functions (aot_pipeline adds
    # transformers' warning_once once it is looked up) pickle by reference, not as plain values.
    if set_name == "dynamo" and getattr(torch_config, "ignore_logging_functions", None):
        disagreeing["ignore_logging_functions"] = set()
    with torch_config.patch(disagreeing):
        blob = torch_config.save_config()
    with pytest.raises(ConfigLoadError, match=r"unknown flag\(s\) .*strict=False"):
        ours.load_config(blob, allow_pickle=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours.load_config(blob, allow_pickle=True, strict=False)
    assert any("skipped" in str(w.message) for w in caught)
    theirs = pickle.loads(blob)
    shared = [name for name in theirs if name in ours.flags()]
    assert len(shared) > 10
    for name in shared:
        assert getattr(ours, name) == theirs[name], name


def test_strict_false_still_refuses_bad_values() -> None:
    with pytest.raises(ConfigLoadError, match="activation_memory_budget = 3.0 is not valid"):
        functorch.load_config({"bogus": 1, "activation_memory_budget": 3.0}, strict=False)
