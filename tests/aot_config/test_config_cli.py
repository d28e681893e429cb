"""The `aot-config show` command: table, --changed, --json, errors, console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from aot_config import cli, dynamo, functorch
from subprocess_limits import SUBPROCESS_TIMEOUT_S


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("set_name", "config"), [("functorch", functorch), ("dynamo", dynamo)])
def test_table_lists_every_flag_with_doc(capsys, monkeypatch, set_name, config) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = run_cli(capsys, "show", set_name)
    assert code == 0
    assert out.startswith(f"{set_name}: {len(config.flags())} flags")
    lines = {line.split()[0]: line for line in out.splitlines()[3:] if line[:1].strip()}
    assert set(lines) == set(config.flags())
    row = lines["debug_partitioner" if set_name == "functorch" else "verbose"]
    assert row.split()[1:5] == ["bool", "False", "False", "default"]
    assert "yes" in row.split()  # compile-ignored column
    assert config.flags()[row.split()[0]].doc in row


def test_both_sets_by_default(capsys) -> None:
    code, out, _ = run_cli(capsys, "show")
    assert code == 0
    assert "functorch: " in out and "dynamo: " in out


def test_narrow_terminal_puts_doc_on_its_own_line(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run_cli(capsys, "show", "functorch")
    assert "\n      Apply common-subexpression elimination" in out


def test_changed_shows_only_changed_flags_marked(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # the doc column inline, whatever runs the tests
    functorch.activation_memory_budget = 0.5
    code, out, _ = run_cli(capsys, "show", "functorch", "--changed")
    assert code == 0
    assert out.startswith(f"functorch: 1 of {len(functorch.flags())} flags ")
    assert "activation_memory_budget *" in out
    assert "cse" not in out.split("doc", 1)[1]


def test_changed_with_nothing_changed(capsys) -> None:
    _, out, _ = run_cli(capsys, "show", "dynamo", "--changed")
    assert "(no flags differ from their defaults)" in out


def test_json_output(capsys) -> None:
    dynamo.optimize_ddp = "python_reducer"
    dynamo.traceable_tensor_subclasses = {int}
    code, out, _ = run_cli(capsys, "show", "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"functorch", "dynamo"}
    records = {r["name"]: r for r in report["dynamo"]}
    assert set(records) == set(dynamo.flags())
    assert records["optimize_ddp"] == {
        "name": "optimize_ddp",
        "type": "bool | str",
        "default": True,
        "value": "python_reducer",
        "source": "set",
        "changed": True,
        "env": None,
        "env_forces": None,
        "compile_ignored": False,
        "choices": None,
        "range": None,
        "aliases": [],
        "inert": None,
        "doc": dynamo.flags()["optimize_ddp"].doc,
    }
    assert records["traceable_tensor_subclasses"]["value"] == ["builtins.int"]
    assert records["verbose"]["env"] == "TORCHDYNAMO_VERBOSE"
    assert records["verbose"]["compile_ignored"] == "debug"
    assert records["dynamic_shapes"]["inert"]
    budget = {r["name"]: r for r in report["functorch"]}["activation_memory_budget"]
    assert budget["range"] == [0.0, 1.0]


def test_json_changed(capsys) -> None:
    functorch.cse = False
    _, out, _ = run_cli(capsys, "show", "functorch", "--json", "--changed")
    assert [r["name"] for r in json.loads(out)["functorch"]] == ["cse"]


def test_unknown_flag_set_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["show", "inductor"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'inductor'" in capsys.readouterr().err


def test_missing_command_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any flag variable, plus ``extra``."""
    variables = {
        v
        for config in (functorch, dynamo)
        for f in config.flags().values()
        for v in (f.env, f.env_forces)
    }
    return {**{k: v for k, v in os.environ.items() if k not in variables}, **extra}


def test_console_script_reports_env_and_bad_env() -> None:
    script = shutil.which("aot-config") or None
    command = [script] if script else [sys.executable, "-m", "aot_config.cli"]
    ok = subprocess.run(
        [*command, "show", "functorch", "--changed"],
        capture_output=True,
        text=True,
        env=clean_env(AOT_MIN_CUT_SOLVER="networkx", COLUMNS="200"),
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert ok.returncode == 0, ok.stderr
    row = next(line for line in ok.stdout.splitlines() if line.startswith("min_cut_solver"))
    assert row.split()[:7] == [
        "min_cut_solver",
        "*",
        "str",
        "'networkx'",
        "'scipy'",
        "env",
        "AOT_MIN_CUT_SOLVER",
    ]
    bad = subprocess.run(
        [*command, "show", "dynamo"],
        capture_output=True,
        text=True,
        env=clean_env(TORCHDYNAMO_VERBOSE="perhaps"),
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith(
        "aot-config: error: environment variable TORCHDYNAMO_VERBOSE='perhaps'"
    )
    assert "Traceback" not in bad.stderr
