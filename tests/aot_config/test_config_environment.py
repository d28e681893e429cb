"""Environment variables: each one really changes its flag (in a fresh process); strict parsing."""

from __future__ import annotations

import json
import os

import pytest
from aot_config import BOOL_SPELLINGS, Flag, dynamo, functorch, parse_env_bool

FLAG_SETS = {"functorch": functorch, "dynamo": dynamo}
ENV_FLAGS = [
    (set_name, name, flag.env)
    for set_name, config in FLAG_SETS.items()
    for name, flag in config.flags().items()
    if flag.env
]

# The seed's variables: every one must be wired to the right flag.
SEED_VARIABLES = {
    "FAKE_ALLOW_META": "fake_tensor_allow_meta",
    "AOT_PARTITIONER_DEBUG": "debug_partitioner",
    "PARTITIONER_MEMORY_BUDGET_PARETO": "visualize_memory_budget_pareto",
    "TORCH_COMPILE_GRAPH_FORMAT": "torch_compile_graph_format",
    "ENABLE_AOT_AUTOGRAD_CACHE": "enable_autograd_cache",
    "AOT_MIN_CUT_SOLVER": "min_cut_solver",
    "TORCHDYNAMO_VERBOSE": "verbose",
    "TORCH_COMPILE_USE_LAZY_GRAPH_MODULE": "use_lazy_graph_module",
    "TORCHDYNAMO_SUPPRESS_ERRORS": "suppress_errors",
    "TORCH_COMPILE_REPLAY_RECORD": "replay_record_enabled",
    "TORCH_COMPILE_DISABLE": "disable",
    "TORCH_COMPILE_CPROFILE": "cprofile",
    "TORCHDYNAMO_REPRO_AFTER": "repro_after",
    "TORCHDYNAMO_REPRO_LEVEL": "repro_level",
    "TORCHDYNAMO_REPRO_FORWARD_ONLY": "repro_forward_only",
    "TORCHDYNAMO_REPRO_IGNORE_NON_FP": "repro_ignore_non_fp",
    "TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS": "capture_scalar_outputs",
    "TORCHDYNAMO_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS": "capture_dynamic_output_shape_ops",
    "TORCH_DYNAMO_DO_NOT_EMIT_RUNTIME_ASSERTS": "do_not_emit_runtime_asserts",
    "TORCHDYNAMO_CPP_GUARD_MANAGER": "enable_cpp_guard_manager",
    "TORCHDYNAMO_INLINE_INBUILT_NN_MODULES": "inline_inbuilt_nn_modules",
    "TORCH_COMPILE_DEBUG_DIR": "debug_dir_root",
    "TORCH_FAKE_TENSOR_DISPATCH_CACHE": "fake_tensor_cache_enabled",
    "TORCH_FAKE_TENSOR_DISPATCH_CACHE_CROSSCHECK": "fake_tensor_cache_crosscheck_enabled",
}


def env_setting(flag: Flag) -> tuple[str, object]:
    """A raw environment string for ``flag`` and the value it must produce."""
    if flag.name == "debug_dir_root":
        return "/tmp/aot-debug", os.path.join("/tmp/aot-debug", "torch_compile_debug")
    default = flag.default
    if isinstance(default, bool):
        return ("Off" if default else "YES"), not default
    if flag.choices is not None:
        choice = next(c for c in flag.choices if c != default)
        return str(choice), choice
    if isinstance(default, int):
        return str(default + 1), default + 1
    return "png", "png"


def test_every_seed_variable_is_declared() -> None:
    declared = {env: name for _, name, env in ENV_FLAGS}
    assert declared == SEED_VARIABLES


@pytest.mark.parametrize(("set_name", "name", "variable"), ENV_FLAGS)
def test_environment_variable_changes_its_flag(
    run_python, set_name: str, name: str, variable: str
) -> None:
    config = FLAG_SETS[set_name]
    raw, expected = env_setting(config.flags()[name])
    assert expected != getattr(config, name)
    result = run_python(
        f"import json; from aot_config import {set_name} as c\n"
        f"print(json.dumps([c.{name}, c.value_source({name!r}), c.is_default({name!r})]))",
        env={variable: raw},
    )
    assert result.returncode == 0, result.stderr
    value, source, is_default = json.loads(result.stdout)
    assert value == expected
    assert source == f"env {variable}"
    # The environment sets the default: the flag still counts as default and can be overridden.
    assert is_default is True


def test_environment_default_can_be_overridden(run_python) -> None:
    result = run_python(
        "from aot_config import functorch as c\n"
        "c.min_cut_solver = 'scipy'\nprint(c.min_cut_solver, c.value_source('min_cut_solver'))",
        env={"AOT_MIN_CUT_SOLVER": "networkx"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["scipy", "set"]


FORCED_MODULE = """
import sys, types, warnings
from aot_config import Flag, install_config_module
m = types.ModuleType("forced_demo")
m.fast = Flag(False, env_forces="DEMO_FORCE_FAST", doc="demo")
install_config_module(m)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m.fast = False
print(m.fast, m.value_source("fast"), str(caught[0].message))
"""


def test_env_forces_wins_over_writes_and_says_so(run_python) -> None:
    result = run_python(FORCED_MODULE, env={"DEMO_FORCE_FAST": "on"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("True forced by DEMO_FORCE_FAST ")
    assert "forced to True by the environment variable DEMO_FORCE_FAST" in result.stdout


@pytest.mark.parametrize("spelling", sorted(BOOL_SPELLINGS))
def test_every_bool_spelling_in_any_case(spelling: str) -> None:
    expected = BOOL_SPELLINGS[spelling]
    for variant in (spelling, spelling.upper(), spelling.capitalize(), f" {spelling}\n"):
        assert parse_env_bool(variant, "X") is expected


@pytest.mark.parametrize("raw", ["", "2", "maybe", "tru", "enabled", "-1"])
def test_unknown_bool_spelling_names_variable_and_spellings(raw: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"environment variable MY_VAR={raw!r} is not a boolean: accepted spellings are "
        r"1/true/yes/on/0/false/no/off \(any case\)",
    ):
        parse_env_bool(raw, "MY_VAR")


def test_bad_bool_fails_the_import_in_a_real_process(run_python) -> None:
    result = run_python("import aot_config.dynamo", env={"TORCHDYNAMO_VERBOSE": "sure"})
    assert result.returncode != 0
    assert "environment variable TORCHDYNAMO_VERBOSE='sure' is not a boolean" in result.stderr


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("TORCHDYNAMO_REPRO_LEVEL", "high", r"TORCHDYNAMO_REPRO_LEVEL='high' is not a valid int"),
        (
            "TORCHDYNAMO_REPRO_LEVEL",
            "7",
            r"TORCHDYNAMO_REPRO_LEVEL='7': .*repro_level is not valid",
        ),
        (
            "TORCHDYNAMO_REPRO_AFTER",
            "both",
            r"TORCHDYNAMO_REPRO_AFTER='both': .*expected one of None, 'aot', 'dynamo'",
        ),
        (
            "AOT_MIN_CUT_SOLVER",
            "glpk",
            r"AOT_MIN_CUT_SOLVER='glpk': .*min_cut_solver is not valid: expected one of 'scipy'",
        ),
    ],
)
def test_bad_environment_values_are_rejected(
    make_config, variable: str, raw: str, message: str
) -> None:
    config = FLAG_SETS["dynamo" if variable.startswith("TORCHDYNAMO") else "functorch"]
    name = next(n for n, f in config.flags().items() if f.env == variable)
    original = config.flags()[name]
    declaration = Flag(
        original.default,
        type=original.type,
        env=variable,
        choices=original.choices,
        range=original.range,
    )
    with pytest.raises(ValueError, match=f"environment variable {message}"):
        make_config(environ={variable: raw}, **{name: declaration})


def test_env_typed_parsing(make_config) -> None:
    config = make_config(
        environ={"A": "0.25", "B": "12", "C": "no", "D": "hello"},
        ratio=Flag(1.0, env="A"),
        count=Flag(3, env="B"),
        mode=Flag(True, type=bool | str, env="C"),
        name=Flag("x", env="D"),
    )
    assert (config.ratio, config.count, config.mode, config.name) == (0.25, 12, False, "hello")


def test_debug_dir_rule() -> None:
    assert dynamo.default_debug_dir_root({"TORCH_COMPILE_DEBUG_DIR": "/x"}) == os.path.join(
        "/x", "torch_compile_debug"
    )
    assert dynamo.default_debug_dir_root({}) == os.path.join(os.getcwd(), "torch_compile_debug")
