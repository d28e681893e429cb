"""load_config bounds what it reads (issue 27): nesting, number length, names and size give the
package's ConfigLoadError, never a RecursionError, a raw ValueError or a memory blow-up; long
values are echoed shortened."""

from __future__ import annotations

import json
import warnings

import pytest
from aot_config import ConfigLoadError, Flag, functorch
from aot_config.persistence import MAX_DEPTH, MAX_FLAGS, MAX_NUMBER_CHARS, MAX_SAVED_BYTES

WHO = "aot_config.functorch.load_config"


def document(flags_json: str) -> bytes:
    return ('{"format":"aot_config.save_config","version":1,"module":"aot_config.functorch",'
            f'"flags":{flags_json}}}').encode()


def load_error(data: bytes, **kwargs) -> str:
    before = functorch.save_config()
    with pytest.raises(ConfigLoadError) as info:
        functorch.load_config(data, **kwargs)
    assert functorch.save_config() == before  # all-or-nothing: nothing was applied
    return str(info.value)


DEEP = (f"{WHO}: the data nests arrays and objects more than {MAX_DEPTH} deep; a saved config "
        "nests a few levels")


@pytest.mark.parametrize("depth", [900, 100_000, MAX_DEPTH])
def test_deep_nesting_is_refused(depth):
    assert load_error(document('{"cse":' + "[" * depth + "]" * depth + "}")) == DEEP


def test_shallow_nesting_is_read():
    depth = MAX_DEPTH - 3  # the document and "flags" are two levels, the innermost list one
    with pytest.raises(ConfigLoadError) as info:  # read, then refused as a value of cse
        functorch.load_config(document('{"cse":' + "[" * depth + "]" * depth + "}"))
    assert "aot_config.functorch.cse = " in str(info.value)
    functorch.load_config(document('{"cse": false}'))
    assert functorch.cse is False


def test_a_number_of_5001_digits_is_refused():
    assert load_error(document('{"max_dist_from_bw":' + "9" * 5001 + "}")) == (
        f"{WHO}: a number in the data has 5001 characters; at most {MAX_NUMBER_CHARS} are read")
    assert load_error(document('{"activation_memory_budget":0.' + "5" * 200 + "}")) == (
        f"{WHO}: a number in the data has 202 characters; at most {MAX_NUMBER_CHARS} are read")


def test_a_number_within_the_bound_is_read():
    functorch.load_config(document('{"max_dist_from_bw":' + "1" + "0" * 20 + "}"))
    assert functorch.max_dist_from_bw == 10**20


def test_too_many_names_are_refused_before_any_is_looked_at():
    names = ",".join(f'"k{i}":0' for i in range(MAX_FLAGS + 1))
    assert load_error(document("{" + names + "}"), strict=False) == (
        f'{WHO}: "flags" has {MAX_FLAGS + 1} names; a saved config has at most {MAX_FLAGS}')


def test_a_document_over_the_size_limit_is_refused_unread():
    data = document('{"cse": false}') + b" " * MAX_SAVED_BYTES
    assert load_error(data) == (f"{WHO}: the data is {len(data)} bytes; a saved config is at "
                                f"most {MAX_SAVED_BYTES} bytes (4 MiB)")
    assert load_error(b"\x80" + b"x" * MAX_SAVED_BYTES, allow_pickle=True).startswith(
        f"{WHO}: the data is {MAX_SAVED_BYTES + 1} bytes")


def test_many_unknown_names_are_counted_not_listed():
    names = {f"unknown_{i}": 0 for i in range(1000)}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        functorch.load_config(document(json.dumps({**names, "cse": False})), strict=False)
    (warning,) = [str(w.message) for w in record]
    shown = ", ".join(f"'unknown_{i}'" for i in range(8))
    assert warning == f"{WHO} skipped 1000 name(s) with no flag here: {shown} and 992 more"
    assert functorch.cse is False


def test_a_long_unknown_name_is_shortened():
    name = "n" * 100_000
    message = load_error(document(json.dumps({name: 0})))
    assert message.startswith(f"{WHO}: unknown flag(s) '{'n' * 199}... (100002 characters)")
    assert len(message) < 1000


def test_a_long_environment_value_is_echoed_once_and_shortened(make_config):
    raw = "x" * 120_000
    declaration = Flag("scipy", choices=("scipy", "networkx"), env="AOT_TEST_LONG")
    with pytest.raises(ValueError) as info:
        make_config(environ={"AOT_TEST_LONG": raw}, solver=declaration)
    message = str(info.value)
    assert message.startswith(f"environment variable AOT_TEST_LONG='{'x' * 199}... (120002 "
                              "characters): ")
    assert message.endswith(".solver is not valid: expected one of 'scipy', 'networkx'")
    assert message.count("xxxxxxxxxx") < 25 and len(message) < 400


def test_a_short_environment_value_is_named_in_full(make_config):
    declaration = Flag("scipy", choices=("scipy", "networkx"), env="AOT_TEST_SHORT")
    with pytest.raises(ValueError) as info:
        make_config(environ={"AOT_TEST_SHORT": "glpk"}, solver=declaration)
    assert str(info.value).startswith("environment variable AOT_TEST_SHORT='glpk': ")
    assert str(info.value).count("glpk") == 1
