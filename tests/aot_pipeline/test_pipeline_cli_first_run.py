"""A first run of aot-pipeline: the hint without a command, the examples under each --help."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from aot_pipeline.cli import UsageError, build_parser, main
from aot_pipeline.cli_help import EXAMPLES, SUMMARIES
from subprocess_limits import SUBPROCESS_TIMEOUT_S

COMMANDS = ("partition", "pareto", "train")
# main() in a fresh interpreter: its exit status, whether torch got imported, its stderr.
PROBE = ("import json, sys; from aot_pipeline.cli import main; code = main(sys.argv[1:]); "
         "print(json.dumps([code, 'torch' in sys.modules]))")


def test_no_command_prints_the_three_commands_and_exits_2():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT_S)
    assert json.loads(result.stdout) == [2, False]  # answered at once, like a usage error
    hint = result.stderr
    assert hint.startswith("aot-pipeline: no command given. Start with one of:\n")
    for command in COMMANDS:
        assert f"\n  aot-pipeline {command} --model " in hint
        assert SUMMARIES[command] in hint
    assert "<command> --help" in hint and "Traceback" not in hint


def test_options_without_a_command_get_the_hint_too(capsys):
    assert main(["-v"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_a_command_gets_no_hint(capsys):
    assert main(["train", "--steps", "0"]) == 2  # its own one-line error instead
    err = capsys.readouterr().err
    assert "no command given" not in err and "must be between 1 and 100000" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_each_help_shows_its_examples(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "\nexamples:\n" in text
    for line, what in EXAMPLES[command]:
        assert f"\n  {line}\n      {what}\n" in text  # kept as written, one per line
    assert 'torch.compile(model, backend="aot_pipeline"' in text


@pytest.mark.parametrize("line", [line for examples in EXAMPLES.values()
                                  for line, _ in examples])
def test_every_example_is_a_valid_command_line(line):
    """The examples parse with the real parser, so they cannot drift from the options."""
    words = shlex.split(line)
    assert words[0] == "aot-pipeline"
    args = build_parser().parse_args(words[1:])
    assert args.command in COMMANDS and line.startswith(f"aot-pipeline {args.command} ")


def test_a_stale_example_would_fail_that_check():
    with pytest.raises(UsageError, match="'nope' is neither a built-in model"):
        build_parser().parse_args(shlex.split("partition --model nope"))
