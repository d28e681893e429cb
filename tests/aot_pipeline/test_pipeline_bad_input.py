"""Bad input to compile(), the options and the CLI (issue 27): one clear line, exit 2, nothing
written, no traceback; and the unreachable byte budget behaves one way everywhere."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import warnings
from pathlib import Path

import aot_pipeline
import pytest
import torch
from aot_partition import MemoryBudgetBestEffortWarning, UnreachableMemoryBudgetError
from aot_pipeline import PipelineOptionError, PipelineOptions
from aot_pipeline.cli import OutputError, _write_output, main
from aot_pipeline.options import echo_value, parse_memory_budget
from torch import nn

UNITS = "units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"
NOT_A_BUDGET = ("memory_budget must be a fraction in [0, 1] (e.g. 0.5), a size with a unit "
                f"(e.g. '300MiB'; {UNITS}) or a peak cap (e.g. '20GiB peak' or '0.8 peak'), "
                "got {!r}")


# ---- memory_budget values -----------------------------------------------------------------

@pytest.mark.parametrize("text", ["1e400MiB", "9999999999999999999999TiB"])
def test_a_size_too_large_is_refused_not_an_overflow(text):
    message = f"memory_budget {text!r} is too large: at most 9223372036854775807 bytes (8 EiB)"
    with pytest.raises(PipelineOptionError) as info:
        aot_pipeline.compile(nn.Linear(2, 2), memory_budget=text)
    assert str(info.value) == message
    with pytest.raises(PipelineOptionError) as info:
        parse_memory_budget(text)
    assert str(info.value) == message


def test_the_largest_size_is_accepted():
    assert PipelineOptions(memory_budget="8388607TiB").memory_budget_bytes == 8388607 * 2**40


@pytest.mark.parametrize("text", ["0.5", " 1 ", "0", ".25", "1e-1"])
def test_a_fraction_as_a_string_is_refused_by_the_api(text):
    with pytest.raises(PipelineOptionError) as info:
        aot_pipeline.compile(nn.Linear(2, 2), memory_budget=text)
    assert str(info.value) == (
        f"memory_budget {text!r} is a string without a unit: give a fraction in [0, 1] as a "
        f"number (memory_budget={text.strip()}) or a size with a unit, e.g. '300MiB'")


def test_a_fraction_as_a_number_and_a_size_as_a_string_are_accepted():
    assert aot_pipeline.compile(nn.Linear(2, 2), memory_budget=0.5).options.memory_budget == 0.5
    assert PipelineOptions(memory_budget="2KiB").memory_budget_bytes == 2048


@pytest.mark.parametrize("text", ["５MiB", "٥", "٠.٥", "5\u00a0MiB", "１"])
def test_digits_of_other_scripts_are_not_numbers(text):
    with pytest.raises(PipelineOptionError) as info:
        parse_memory_budget(text)
    assert str(info.value) == NOT_A_BUDGET.format(text)
    with pytest.raises(PipelineOptionError, match=r"^cannot read memory_budget "):
        PipelineOptions(memory_budget=text)


def test_half_names_memory_budget():
    with pytest.raises(PipelineOptionError) as info:
        parse_memory_budget("half")
    assert str(info.value) == NOT_A_BUDGET.format("half")
    with pytest.raises(PipelineOptionError) as info:
        aot_pipeline.compile(nn.Linear(2, 2), memory_budget="half")
    assert str(info.value) == (
        "cannot read memory_budget 'half': write a number and a unit, e.g. '300MiB' or '1.5GB' "
        f"({UNITS})")


def test_a_long_budget_is_echoed_shortened():
    text = "9" * 5000 + "x"
    with pytest.raises(PipelineOptionError) as info:
        parse_memory_budget(text)
    assert str(info.value).endswith(f"got '{'9' * 199}... (5003 chars)")


def test_best_effort_must_be_a_bool():
    with pytest.raises(PipelineOptionError) as info:
        aot_pipeline.compile(nn.Linear(2, 2), memory_budget_best_effort="yes")
    assert str(info.value) == "memory_budget_best_effort must be True or False, got 'yes'"


# ---- the unreachable byte budget, through compile() ----------------------------------------

def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8)


def _dropout_mlp() -> tuple[nn.Module, torch.Tensor]:
    """Its dropout keeps a mask or an RNG state whatever the cut: 1 byte is out of reach (inputs
    and parameters cost nothing in the one measure of saved bytes, so an mlp reaches 0)."""
    torch.manual_seed(0)
    return (nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4)),
            torch.randn(2, 8))


UNREACHABLE_1B = ("activation memory budget 1 bytes is unreachable: the least this graph can "
                  "save is 288 bytes (runtime-optimal)")


def test_an_mlp_reaches_a_cap_of_0_bytes(fresh_dynamo):
    model, x = _mlp()
    compiled = aot_pipeline.compile(model, memory_budget="0B", compiler="nop")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemoryBudgetBestEffortWarning)
        compiled(x).sum().backward()


def test_compile_with_an_unreachable_cap_fails_naming_the_least_size(fresh_dynamo):
    model, x = _dropout_mlp()
    compiled = aot_pipeline.compile(model, memory_budget="1B", compiler="nop")
    with pytest.raises(Exception) as info:
        compiled(x)
    cause = info.value
    while not isinstance(cause, UnreachableMemoryBudgetError):  # torch.compile wraps it
        cause = cause.__cause__ or cause.inner_exception
    assert str(cause) == UNREACHABLE_1B
    assert (cause.cap, cause.least) == (1, 288)


def test_compile_best_effort_warns_and_takes_the_least_cut(fresh_dynamo):
    model, x = _dropout_mlp()
    compiled = aot_pipeline.compile(model, memory_budget="1B", compiler="nop",
                                    memory_budget_best_effort=True)
    with pytest.warns(MemoryBudgetBestEffortWarning) as record:
        torch.manual_seed(1)
        out = compiled(x)
    out.sum().backward()
    assert [str(w.message) for w in record] == [
        f"{UNREACHABLE_1B}; best effort (activation_memory_budget_best_effort): took the "
        "runtime-optimal cut at 288 bytes"]
    expected, _ = _dropout_mlp()
    torch.manual_seed(1)
    torch.testing.assert_close(out, expected(x))


def test_compile_with_a_reachable_cap_does_not_warn(fresh_dynamo):
    model, x = _mlp()
    compiled = aot_pipeline.compile(model, memory_budget="64B", compiler="nop",
                                    memory_budget_best_effort=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemoryBudgetBestEffortWarning)
        compiled(x).sum().backward()


def test_the_flag_reaches_the_registered_backend(fresh_dynamo):
    from aot_config import functorch as functorch_flags

    model, x = _dropout_mlp()
    with functorch_flags.patch(activation_memory_budget_bytes=1,
                               activation_memory_budget_best_effort=True):
        compiled = torch.compile(model, backend="aot_pipeline",
                                 options={"compiler": "nop"})
        with pytest.warns(MemoryBudgetBestEffortWarning, match="took the runtime-optimal cut"):
            compiled(x)


def test_best_effort_is_part_of_the_partitioner_cache_key():
    import pickle

    from aot_pipeline.backend import AotPipelinePartitioner

    strict = AotPipelinePartitioner(1.0, "dp", memory_budget_bytes=1)
    lenient = AotPipelinePartitioner(1.0, "dp", memory_budget_bytes=1, best_effort=True)
    assert strict.uuid() != lenient.uuid()
    assert pickle.loads(pickle.dumps(lenient)).uuid() == lenient.uuid()


# ---- the CLI: unreachable budgets --------------------------------------------------------

def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aot_pipeline.cli", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})


CLI_UNREACHABLE = (
    "aot-pipeline: error: argument --memory-budget: activation memory budget 1 bytes is "
    "unreachable: the least this graph can save is 288 bytes (runtime-optimal); give "
    "--memory-budget 288B or more, or --memory-budget-best-effort to take that cut with a warning")
# train compiles the loss with the model (BuiltModel.training_step()): its graph saves more.
TRAIN_UNREACHABLE = CLI_UNREACHABLE.replace("288", "320")
# A model whose least cut keeps something (its dropout's mask): every built-in model reaches
# 0 bytes, the inputs being free in the one measure of saved bytes.
DROPOUT_MLP = f"{Path(__file__).parent / 'user_models' / 'tiny_factories.py'}:dropout_mlp"


def _stderr_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines()
            if "cpp_extension" not in line]  # torch's own CPU-only notice


def test_cli_partition_with_an_unreachable_cap_is_one_line():
    result = _run("partition", "--model", DROPOUT_MLP, "--memory-budget", "1B")
    assert (result.returncode, _stderr_lines(result), result.stdout) == (2, [CLI_UNREACHABLE], "")


def test_cli_partition_best_effort_warns_and_says_what_it_saved():
    result = _run("partition", "--model", DROPOUT_MLP, "--memory-budget", "1B",
                  "--memory-budget-best-effort")
    assert result.returncode == 0, result.stderr
    assert _stderr_lines(result) == [
        "aot-pipeline: warning: activation memory budget 1 bytes is unreachable: the least this "
        "graph can save is 288 bytes (runtime-optimal); best effort "
        "(activation_memory_budget_best_effort): took the runtime-optimal cut at 288 bytes"]
    assert ", saved-bytes cap 1 bytes (knapsack solver dp; " in result.stdout
    assert "saved (288 B)" in result.stdout


def test_cli_train_with_an_unreachable_cap_fails_and_writes_nothing(tmp_path):
    target = tmp_path / "r.json"
    result = _run("train", "--model", DROPOUT_MLP, "--steps", "1", "--compiler", "nop",
                  "--variants", "aot_pipeline", "--no-progress", "--memory-budget", "1B",
                  "--json", str(target))
    assert result.returncode == 2
    assert _stderr_lines(result) == [TRAIN_UNREACHABLE]
    assert list(tmp_path.iterdir()) == []


# ---- the CLI: output paths ------------------------------------------------------------------

def _error_of(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, captured.err
    return captured.err.strip()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_up_front(tmp_path, capsys):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    assert _error_of(capsys, "train", "--json", str(fifo)) == (
        f"aot-pipeline: error: argument --json: cannot write {str(fifo)!r}: it is a FIFO, not a "
        "regular file; give a file path")
    png = tmp_path / "plot.png"
    os.mkfifo(png)
    assert _error_of(capsys, "pareto", "--output", str(png)) == (
        f"aot-pipeline: error: argument --output: cannot write {str(png)!r}: it is a FIFO, not "
        "a regular file; give a file path")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_device_is_refused_up_front(capsys):
    assert _error_of(capsys, "train", "--json", "/dev/full") == (
        "aot-pipeline: error: argument --json: cannot write '/dev/full': it is a character "
        "device, not a regular file; give a file path")


def test_a_symlink_loop_is_refused_up_front(tmp_path, capsys):
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    assert _error_of(capsys, "train", "--json", str(loop)) == (
        f"aot-pipeline: error: argument --json: cannot write {str(loop)!r}: Too many levels of "
        "symbolic links")


def test_a_dangling_link_is_refused_up_front(tmp_path, capsys):
    link = tmp_path / "r.json"
    link.symlink_to(tmp_path / "elsewhere" / "target.json")
    assert _error_of(capsys, "train", "--json", str(link)) == (
        f"aot-pipeline: error: argument --json: cannot write {str(link)!r}: it is a link to a "
        "missing file; give the target's path")


def test_a_name_over_the_limit_is_refused_up_front(tmp_path, capsys):
    name = "x" * 300 + ".json"
    path = str(tmp_path / name)
    assert _error_of(capsys, "train", "--json", path) == (
        f"aot-pipeline: error: argument --json: cannot write {echo_value(path)}: File name too "
        "long")
    assert echo_value(path).endswith(f"... ({len(repr(path))} chars)")


def test_a_missing_name_over_the_limit_under_a_new_folder_is_refused(tmp_path, capsys):
    name = "y" * 300
    path = str(tmp_path / "new" / f"{name}.png")
    assert _error_of(capsys, "pareto", "--output", path) == (
        f"aot-pipeline: error: argument --output: cannot write {echo_value(path)}: the name "
        f"{echo_value(name + '.png')} is longer than 255 bytes, the most this file system "
        "allows")
    assert not (tmp_path / "new").exists()


def test_regular_and_new_files_pass_the_check(tmp_path):
    from aot_pipeline.cli import _checked_output_path

    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert _checked_output_path(str(existing), None) == existing
    assert _checked_output_path(str(tmp_path / "a" / "b.png"), ".png") == tmp_path / "a" / "b.png"
    link = tmp_path / "link.json"
    link.symlink_to(existing)
    assert _checked_output_path(str(link), None) == link


def test_a_failed_write_is_one_error_and_leaves_nothing(tmp_path):
    target = tmp_path / "out" / "r.json"

    def disk_full(temporary: Path) -> None:
        temporary.write_text("partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OutputError) as info:
        _write_output(target, disk_full)
    assert str(info.value) == f"cannot write {str(target)!r}: No space left on device"
    assert list((tmp_path / "out").iterdir()) == []


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    _write_output(target, lambda temporary: temporary.write_text("new"))
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_steps_in_other_scripts_are_not_numbers(capsys):
    assert _error_of(capsys, "train", "--steps", "５") == (
        "aot-pipeline: error: argument --steps: '５' is not a whole number")
    assert _error_of(capsys, "pareto", "--budgets", "1,٠.٥") == (
        "aot-pipeline: error: argument --budgets: memory_budget must be a number in [0, 1] such "
        "as 0.5, got '٠.٥'")


@pytest.mark.parametrize(("value", "message"), [
    ("1e400MiB", "memory_budget '1e400MiB' is too large: at most 9223372036854775807 bytes "
                 "(8 EiB)"),
    ("half", NOT_A_BUDGET.format("half")),
    ("５MiB", NOT_A_BUDGET.format("５MiB")),
    ("1e400", "memory_budget must be in [0, 1] (1.0 saves every activation the min-cut keeps, "
              "0.0 recomputes as much as possible), got inf (or give a size with a unit, e.g. "
              "'300MiB', for a cap in bytes)"),
])
def test_cli_memory_budget_errors_are_one_line(capsys, value, message):
    for command in ("train", "partition"):
        assert _error_of(capsys, command, "--memory-budget", value) == (
            f"aot-pipeline: error: argument --memory-budget: {message}")


def test_cli_control_characters_and_long_values_stay_on_one_line(capsys):
    assert _error_of(capsys, "train", "\r0") == (
        "aot-pipeline: error: unrecognized arguments: \\r0")
    long_model = "m" * 5000
    assert _error_of(capsys, "train", "--model", long_model) == (
        f"aot-pipeline: error: argument --model: '{'m' * 199}... (5002 chars) is neither a "
        "built-in model (mlp, gpt, llama, convnet) nor a factory 'package.module:function' / "
        "'path/to/file.py:function'")
