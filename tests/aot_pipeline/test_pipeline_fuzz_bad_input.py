"""Generated input for the CLI's parser and the options (issue 27): every input either works or
raises the package's own error (exit 2 with one line for the CLI); no traceback, no hang."""

from __future__ import annotations

import math
import os
import tempfile

import pytest
from aot_pipeline import PipelineOptionError, PipelineOptions
from aot_pipeline import cli as aot_cli
from aot_pipeline.cli_help import no_command_hint
from aot_pipeline.options import parse_memory_budget
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

TOKENS = ["train", "pareto", "partition", "--model", "gpt", "mlp", "--layers", "--steps",
          "--memory-budget", "--memory-budget-best-effort", "--solver", "dp", "--compiler",
          "nop", "--variants", "eager,jax", "--json", "--output", "x.png", "--budgets",
          "1,0.5,0", "--device", "cuda", "--no-progress", "-v", "0.5", "1e400MiB", "300MiB",
          "５", "٠.٥", "-1", "nan", "inf", "", "/dev/full", "/dev/null", "..", "a/b.json",
          "x" * 300, "--no-torch", "--compiled-autograd", "1" * 5000,
          # issue 40's forms: peak budgets, sub-byte sizes, inputs and configs at their limits
          "2GiB peak", "0.8 peak", "1.5 peak", "peak", "1e-400MiB", "--input", "2x4:int8:1000",
          "2x" + "9" * 40, "--model-config", "width=" + "-" * 2000, "--hf", "gpt2",
          "--hf-config", "bogus_key=7", "n_layer=-1", "--exported", "."]
ARGV = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=12)), max_size=8)


@pytest.fixture
def cli_without_work(monkeypatch):
    """``main`` with the commands replaced by no-ops: only the parsing and checks run."""
    for name in ("_train", "_pareto", "_partition"):
        monkeypatch.setattr(aot_cli, name, lambda args: 0)
    with tempfile.TemporaryDirectory(prefix="aot-pipeline-fuzz-") as directory:
        monkeypatch.chdir(directory)  # relative output paths land (unwritten) in a scratch folder
        yield directory
        monkeypatch.undo()  # leave the folder before it is removed


@pytest.mark.timeout(120)
@FUZZ
@given(argv=ARGV)
def test_any_argv_parses_or_is_one_line_with_status_two(cli_without_work, capsys, argv):
    try:
        code = aot_cli.main(argv)
    except SystemExit as done:  # --help and friends: argparse prints and exits 0
        assert done.code == 0 and any(a in ("-h", "--help") or a.startswith("--h") or
                                      a.startswith("-h") for a in argv), argv
        capsys.readouterr()
        return
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code)
    if code == 2 and err.startswith("aot-pipeline: no command given."):
        assert err == no_command_hint() + "\n", argv  # the first-run hint (cli_help)
    elif code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("aot-pipeline: error: "), (argv, err)
        assert len(lines[0]) < 2000, argv  # long values are echoed shortened
    assert os.listdir(cli_without_work) == []  # parsing writes nothing


BUDGETS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(), st.none(),
    st.text(max_size=20), st.binary(max_size=8),
    st.from_regex(r"\A\s?[0-9]{1,400}(\.[0-9]{0,3})?([eE][+-]?[0-9]{1,4})?\s?[kKMGT]?i?[bB]?\Z"),
    st.sampled_from(["1e400MiB", "0.5", "half", "５MiB", "٥", "inf", "nan", "-0", "1e-400",
                     "1e-400MiB", "0.5B", "2GiB peak", "0.8 peak", "1.5 peak", "0 peak",
                     "1e-400MiB peak", " peak"]),
    st.lists(st.floats(), max_size=2),
)


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=400)
@given(budget=BUDGETS)
def test_any_memory_budget_is_accepted_or_a_pipeline_option_error(budget):
    try:
        options = PipelineOptions(memory_budget=budget)
    except PipelineOptionError as error:
        assert "memory_budget" in str(error), (budget, error)
        assert len(str(error)) < 1000
    else:
        assert 0.0 <= options.memory_budget <= 1.0 and not math.isnan(options.memory_budget)
        assert options.memory_budget_bytes is None or \
            0 <= options.memory_budget_bytes < 2**63
        assert isinstance(budget, (int, float, str)) and not isinstance(budget, bool)
    try:
        PipelineOptions.from_mapping({"memory_budget": budget, "memory_budget_bytes": budget},
                                     PipelineOptions())
    except PipelineOptionError:
        pass
    if isinstance(budget, str):
        try:
            fraction, nbytes = parse_memory_budget(budget)
        except PipelineOptionError as error:
            assert "memory_budget" in str(error)
        else:
            assert budget.isascii() and 0.0 <= fraction <= 1.0
            assert nbytes is None or 0 <= nbytes < 2**63
