"""get_hash(): stable across processes, blind to compile-ignored flags, sensitive to the rest."""

from __future__ import annotations

import warnings

import pytest
from aot_config import dynamo, functorch

FLAG_SETS = {"functorch": functorch, "dynamo": dynamo}
ALL_FLAGS = [(s, n) for s, config in FLAG_SETS.items() for n in config.flags()]

HASH_SCRIPT = """
from aot_config import functorch, dynamo
functorch.activation_memory_budget = 0.5
dynamo.allowed_functions_module_string_ignorelist = {"z", "a", "m", "b"}
print(functorch.get_hash().hex(), dynamo.get_hash().hex())
"""


def test_hash_is_stable_across_processes(run_python) -> None:
    # Different hash seeds would reorder the set in a naive serialisation.
    first = run_python(HASH_SCRIPT, env={"PYTHONHASHSEED": "1"})
    second = run_python(HASH_SCRIPT, env={"PYTHONHASHSEED": "2"})
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout
    functorch.activation_memory_budget = 0.5
    dynamo.allowed_functions_module_string_ignorelist = {"z", "a", "m", "b"}
    assert first.stdout.split() == [functorch.get_hash().hex(), dynamo.get_hash().hex()]


def test_hash_is_bytes_and_deterministic() -> None:
    assert isinstance(functorch.get_hash(), bytes)
    assert functorch.get_hash() == functorch.get_hash()
    assert functorch.get_hash() != dynamo.get_hash()


@pytest.mark.parametrize(("set_name", "name"), ALL_FLAGS)
def test_hash_tracks_exactly_the_compile_relevant_flags(
    set_name: str, name: str, alternative_value
) -> None:
    config = FLAG_SETS[set_name]
    flag = config.flags()[name]
    before = config.get_hash()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inert flags warn on write
        setattr(config, name, alternative_value(flag, getattr(config, name)))
    if flag.is_compile_ignored:
        assert config.get_hash() == before
    else:
        assert config.get_hash() != before


def test_hash_returns_when_value_returns() -> None:
    before = functorch.get_hash()
    with functorch.patch(cse=False):
        assert functorch.get_hash() != before
    assert functorch.get_hash() == before


def test_seed_compile_ignored_markers() -> None:
    ignored = {name for name, flag in dynamo.flags().items() if flag.is_compile_ignored}
    assert ignored >= {
        "log_file_name",
        "verbose",
        "verify_correctness",
        "cache_size_limit",
        "accumulated_cache_size_limit",
        "repro_tolerance",
        "repro_ignore_non_fp",
        "same_two_models_use_fp64",
    }
    assert dynamo.flags()["verbose"].compile_ignored == "debug"
    assert dynamo.flags()["cache_size_limit"].compile_ignored == "runtime_behaviour"
    assert not dynamo.flags()["compiled_autograd"].is_compile_ignored
