"""Every validator and type check rejects a bad value with a message naming flag and value."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aot_config import Flag, dynamo, functorch
from aot_config.config_module import matches_type

FLAG_SETS = {"functorch": functorch, "dynamo": dynamo}
ALL_FLAGS = [(s, n) for s, config in FLAG_SETS.items() for n in config.flags()]
VALIDATED = [
    (s, n)
    for s, n in ALL_FLAGS
    if (f := FLAG_SETS[s].flags()[n]).choices is not None or f.range is not None or f.validator
]


def bad_values(flag: Flag) -> list[Any]:
    """Values of an acceptable type that the flag's validator must refuse."""
    values: list[Any] = []
    if flag.choices is not None:
        values.append("not-a-choice" if matches_type("x", flag.type) else 10**6)
    if flag.range is not None:
        low, high = flag.range
        if low is not None:
            values.append(type(low)(low - 1))
        if high is not None:
            values.append(type(high)(high + 1))
    if flag.validator is not None:
        values.append("not-a-mode")
    return values


def test_the_expected_flags_are_validated() -> None:
    assert {n for _, n in VALIDATED} >= {
        "activation_memory_budget",
        "activation_memory_budget_solver",
        "activation_memory_budget_runtime_estimator",
        "min_cut_solver",
        "optimize_ddp",
        "repro_after",
        "repro_level",
    }


@pytest.mark.parametrize(("set_name", "name"), VALIDATED)
def test_validator_rejects_bad_value(set_name: str, name: str) -> None:
    config = FLAG_SETS[set_name]
    before = getattr(config, name)
    for value in bad_values(config.flags()[name]):
        pattern = (
            rf"aot_config\.{set_name}\.{name} = {re.escape(repr(value))} is not valid: expected"
        )
        with pytest.raises(ValueError, match=pattern):
            setattr(config, name, value)
        with pytest.raises(ValueError, match=pattern):
            config.patch(name, value)
    assert getattr(config, name) == before


@pytest.mark.parametrize(("set_name", "name"), ALL_FLAGS)
def test_type_check_rejects_wrong_type(set_name: str, name: str) -> None:
    config = FLAG_SETS[set_name]
    wrong = object()
    with pytest.raises(
        ValueError, match=rf"{set_name}\.{name} = <object object at .*> is not valid: expected"
    ):
        setattr(config, name, wrong)


def test_choice_message_lists_what_is_valid() -> None:
    with pytest.raises(
        ValueError,
        match=r"activation_memory_budget_solver = 'knapsack' is not valid: expected one of "
        r"'dp', 'greedy', 'ilp', 'ilp_graph', 'dp_graph'",
    ):
        functorch.activation_memory_budget_solver = "knapsack"


def test_range_message_lists_the_bounds() -> None:
    with pytest.raises(
        ValueError,
        match=r"activation_memory_budget = 1.5 is not valid: expected a number in \[0.0, 1.0\]",
    ):
        functorch.activation_memory_budget = 1.5
    with pytest.raises(
        ValueError, match=r"repro_level = 9 is not valid: expected a number in \[1, 4\]"
    ):
        dynamo.repro_level = 9


def test_every_valid_choice_is_accepted() -> None:
    for config in FLAG_SETS.values():
        for name, flag in config.flags().items():
            for choice in flag.choices or ():
                setattr(config, name, choice)
                assert getattr(config, name) == choice


def test_custom_validator_message(make_config) -> None:
    config = make_config(
        even=Flag(2, validator=lambda v: None if v % 2 == 0 else "expected an even number")
    )
    config.even = 4
    with pytest.raises(ValueError, match=r"\.even = 3 is not valid: expected an even number"):
        config.even = 3
    assert config.even == 4


def test_nan_is_outside_every_range() -> None:
    with pytest.raises(ValueError, match=r"activation_memory_budget = nan is not valid"):
        functorch.activation_memory_budget = float("nan")


def test_optional_float_widens_int(make_config) -> None:
    config = make_config(scale=Flag(None, type=float | None, range=(0, None)))
    config.scale = 2
    assert config.scale == 2.0 and isinstance(config.scale, float)
    config.scale = None
    assert config.scale is None
