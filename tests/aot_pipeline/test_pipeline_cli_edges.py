"""The CLI's and options' user-input edges (issue 40): each is one clean line naming the culprit,
exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from aot_pipeline.options import PipelineOptionError, parse_byte_size, parse_key_values

RUN_CLI = "import sys; from aot_pipeline.cli import main; sys.exit(main(sys.argv[1:]))"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", RUN_CLI, *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture
def model_files(tmp_path):
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\n")
    factory_exits = tmp_path / "factory_exits.py"
    factory_exits.write_text("import sys\ndef model():\n    sys.exit(3)\n")
    linear = tmp_path / "linear.py"
    linear.write_text("import torch\ndef model():\n    return torch.nn.Linear(4, 4)\n")
    return exits, factory_exits, linear


def test_a_model_file_that_exits_at_import_is_an_error_not_a_success(model_files):
    exits, _, _ = model_files
    line = _one_error_line(_cli("partition", "--model", f"{exits}:model", "--input", "2x4"))
    assert line == (f"aot-pipeline: error: --model '{exits}:model': importing '{exits}' called "
                    "sys.exit(0); a model file must not exit when imported (guard its script "
                    "part with if __name__ == '__main__')")


def test_a_factory_that_exits_is_an_error(model_files):
    _, factory_exits, _ = model_files
    line = _one_error_line(_cli("partition", "--model", f"{factory_exits}:model",
                                "--input", "2x4"))
    assert line == (f"aot-pipeline: error: --model '{factory_exits}:model': the factory called "
                    "sys.exit(3)")


def test_huge_numbers_in_input_are_refused(model_files):
    _, _, linear = model_files
    line = _one_error_line(_cli("partition", "--model", f"{linear}:model",
                                "--input", "2x" + "9" * 5000))
    assert line.endswith(": a number of 5000 digits (at most 12)")
    line = _one_error_line(_cli("partition", "--model", f"{linear}:model",
                                "--input", "2x4:int8:1000"))
    assert line == ("aot-pipeline: error: --input '2x4:int8:1000': the upper bound 1000 is "
                    "beyond int8 (at most 128)")


def test_a_torch_trace_path_that_is_a_file_fails_first(tmp_path):
    not_a_folder = tmp_path / "trace"
    not_a_folder.write_text("")
    line = _one_error_line(_cli("partition", "--model", "mlp",
                                env={"TORCH_TRACE": str(not_a_folder)}))
    assert line == (f"aot-pipeline: error: TORCH_TRACE={str(not_a_folder)!r} is not a folder; "
                    "point it at a folder for torch's trace files, or unset it")


def test_pathological_config_values_are_refused_in_one_line():
    with pytest.raises(PipelineOptionError, match=r"the value of width \('-{20}\.\.\.', 100000 "
                                                   r"characters\) is longer than 1000"):
        parse_key_values("width=" + "-" * 100_000, "--model-config")
    assert parse_key_values("width=" + "-" * 900, "--model-config") == {"width": "-" * 900}


@pytest.mark.parametrize("text", ["1e-400MiB", "0.5B", "1e-30GiB"])
def test_a_positive_size_under_one_byte_is_not_a_zero_cap(text):
    with pytest.raises(PipelineOptionError, match="is less than one byte; write 0B"):
        parse_byte_size(text)


def test_the_opposite_case_zero_and_fractional_sizes_still_read():
    assert parse_byte_size("0B") == 0
    assert parse_byte_size("1.5B") == 1
    assert parse_byte_size("1.5KiB") == 1536


@pytest.mark.parametrize(("config", "message"), [
    ("n_embd=abc", "--hf 'gpt2': bad --hf-config: "),
    ("bogus_key=7", "--hf-config bogus_key=7: GPT2Config has no field 'bogus_key'"),
    ("n_layr=2", "--hf-config n_layr=2: GPT2Config has no field 'n_layr' (did you mean "
                 "'n_layer'?)"),
    ("n_layer=-1", "--hf-config n_layer=-1: must be >= 0 (a count or size; the default is 12)"),
])
def test_transformers_config_mistakes_are_named(config, message):
    from aot_pipeline.options import parse_key_values
    from aot_pipeline.user_models import ModelSpec, UserModelError

    spec = ModelSpec("hf", "gpt2", config=parse_key_values(config, "--hf-config"))
    with pytest.raises(UserModelError) as info:
        spec.build()
    assert str(info.value).startswith(message), str(info.value)


def test_the_opposite_case_known_fields_build():
    from aot_pipeline.user_models import ModelSpec

    spec = ModelSpec("hf", "gpt2", config={"n_layer": 1, "n_embd": 16, "n_head": 2})
    assert sum(p.numel() for p in spec.build().module.parameters()) > 0


def test_an_exported_archive_that_expands_to_gigabytes_is_refused_before_reading(tmp_path):
    import zipfile

    from aot_pipeline.user_models import ModelSpec, UserModelError

    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("model/data/0", "w", force_zip64=True) as member:
            chunk = bytes(1 << 20)
            for _ in range(100):  # 100 MiB of zeros: a few hundred KB compressed
                member.write(chunk)
    with pytest.raises(UserModelError, match=r"archive member 'model/data/0' expands to "
                                             r"104857600 bytes from \d+; refused before reading"):
        ModelSpec("exported", str(bomb)).build()


def test_an_exported_path_that_is_a_folder_is_named_as_such(tmp_path):
    from aot_pipeline.user_models import ModelSpec, UserModelError

    with pytest.raises(UserModelError, match=r"is a folder; give a .pt2 file"):
        ModelSpec("exported", str(tmp_path)).build()


def test_an_input_that_breaks_an_exported_programs_guards_names_input(tmp_path):
    import torch
    from aot_pipeline.user_models import ModelSpec, UserModelError

    path = tmp_path / "linear.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)), path)
    assert ModelSpec("exported", str(path), inputs=("2x4",)).build().module is not None
    with pytest.raises(UserModelError, match=r"--input does not fit --exported '.*linear.pt2' "
                                             r"\(its example inputs: 2x4:float32\): "):
        ModelSpec("exported", str(path), inputs=("2x5",)).build()
