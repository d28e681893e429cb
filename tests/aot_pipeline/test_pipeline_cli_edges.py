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
    with pytest.raises(UserModelError, match=r"--input '2x5' does not fit --exported "
                                             r"'.*linear.pt2' \(its example inputs: "
                                             r"2x4:float32\): "):
        ModelSpec("exported", str(path), inputs=("2x5",)).build()


# ---- issue 52: each unclear error is one line naming the culprit and what is valid ----------

TINY_FACTORIES = __import__("pathlib").Path(__file__).parent / "user_models" / "tiny_factories.py"


def _main_error(capsys, *argv: str) -> str:
    """The command's one error line, run in this process (exit 2, nothing on stdout)."""
    from aot_pipeline.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


@pytest.mark.parametrize(("argv", "message"), [
    # the key and its valid range, not the factory's RuntimeError about a tensor's dimension
    (["--model", f"{TINY_FACTORIES}:mlp", "--model-config", "width=-1"],
     "--model-config width=-1: must be >= 0 (a count or size; the factory's default is 16)"),
    (["--model", f"{TINY_FACTORIES}:mlp", "--model-config", "widht=3"],
     f"--model-config widht=3: the factory '{TINY_FACTORIES}:mlp' has no parameter 'widht' "
     "(did you mean 'width'?); it takes width"),
    # argparse took "-1x4" for an option ("expected one argument")
    (["--model", f"{TINY_FACTORIES}:module_only", "--input", "-1x4"],
     "--input '-1x4': dimension -1 is negative; every dimension must be at least 1, e.g. 2x128"),
    (["--model", f"{TINY_FACTORIES}:module_only", "--input=2x-4"],
     "--input '2x-4': dimension -4 is negative; every dimension must be at least 1, e.g. 2x128"),
    # these three ended in Dynamo's fake-tensor explanations
    (["--model", f"{TINY_FACTORIES}:module_only", "--input", "0"],
     "--input '0': dimension 0 makes an empty tensor; every dimension must be at least 1, e.g. "
     "2x128"),
    (["--model", f"{TINY_FACTORIES}:module_only", "--input", "16384x16384"],
     "--input '16384x16384': 268435456 float32 elements take 1073741824 bytes, over the "
     "268435456 (256 MiB) an example input may; give a smaller shape"),
    (["--model", f"{TINY_FACTORIES}:mlp", "--input", "2x5"],
     f"--input '2x5' does not fit --model '{TINY_FACTORIES}:mlp' (its example inputs: "
     "2x8:float32): RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 8x16)"),
    # the option typed is the one named
    (["--model", f"{TINY_FACTORIES}:mlp", "--model-config", "width"],
     "--model-config 'width': give key=value pairs separated by commas, e.g. "
     "num_classes=10,depth=2"),
    (["--model", f"{TINY_FACTORIES}:mlp", "--model-config", "width=3,width=4"],
     "--model-config: width is given twice; give each key once"),
    (["--model", f"{TINY_FACTORIES}:mlp", "--model-config", "width=3", "--hf-config",
      "width=4"],
     "--model-config given twice (--hf-config too); give every key=value pair in one, "
     "separated by commas"),
])
def test_unclear_model_and_input_errors_are_one_line_naming_the_culprit(capsys, argv, message):
    assert _main_error(capsys, "partition", *argv) == f"aot-pipeline: error: {message}"


def test_the_opposite_case_a_fitting_input_and_config_still_partition(capsys):
    from aot_pipeline.cli import main

    assert main(["partition", "--model", f"{TINY_FACTORIES}:mlp", "--model-config", "width=4",
                 "--input", "3x8"]) == 0
    out, _ = capsys.readouterr()
    assert "saved for backward:" in out


def test_the_input_fit_check_leaves_no_trace_on_the_model():
    """The eager forward that checks --input puts batch-norm statistics and the random state
    back: the model built is the one built without the check."""
    from aot_pipeline.user_models import ModelSpec, _check_inputs_fit

    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.5))
    batch = torch.randn(8, 4) * 5 + 3
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    _check_inputs_fit(ModelSpec("factory", "x:y", inputs=("8x4",)), model, (), (batch,))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_a_torch_trace_folder_that_cannot_be_created_fails_first_in_one_line(capsys,
                                                                           monkeypatch):
    # /proc refuses a new folder even to root, for whom access() says it is writable
    monkeypatch.setenv("TORCH_TRACE", "/proc/x")
    assert _main_error(capsys, "partition", "--model", "mlp", "--layers", "1",
                       "--memory-budget", "0.5") == (
        "aot-pipeline: error: TORCH_TRACE='/proc/x': cannot create that folder (No such file or "
        "directory); point it at a folder you can write, or unset it")


def test_the_opposite_case_a_new_torch_trace_folder_is_fine(tmp_path):
    from aot_pipeline.cli import _check_torch_trace

    _check_torch_trace(str(tmp_path / "new" / "trace"))
    assert (tmp_path / "new" / "trace").is_dir()


def _archive_declaring(path, name: str, declared: int, compressed: int, deflated: bool) -> None:
    """A zip archive whose one member declares ``declared`` bytes uncompressed and
    ``compressed`` stored, its data a hole in a sparse file: a 3 GiB member on disk in
    kilobytes, what zipfile's directory says without a byte of it written (sizes under 4 GiB:
    no zip64 records needed)."""
    import struct

    method = 8 if deflated else 0
    encoded = name.encode()
    with open(path, "wb") as archive:
        archive.write(struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, method, 0, 0x21,
                                  0, compressed, declared, len(encoded), 0) + encoded)
        archive.seek(compressed, 1)  # the member's data: a hole
        directory_at = archive.tell()
        entry = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, method, 0, 0x21,
                            0, compressed, declared, len(encoded), 0, 0, 0, 0, 0, 0) + encoded
        archive.write(entry)
        archive.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(entry),
                                  directory_at, 0))


@pytest.mark.parametrize("deflated", [False, True])
def test_an_exported_archive_declaring_gigabytes_is_refused_by_its_directory(tmp_path, deflated):
    """A 3 GiB member, stored (a 3 GiB file: it was read whole, 7 GB of memory, before torch
    refused it) or deflated from 4 MiB (ratio 768: under the zip-bomb check): refused by the
    sizes the zip directory declares, nothing of the member read, torch not imported."""
    big = tmp_path / "big.pt2"
    compressed = 4 << 20 if deflated else 3 << 30
    _archive_declaring(big, "big/data/0", 3 << 30, compressed, deflated)
    probe = ("import sys, zipfile\n"
             "def refuse(*args, **kwargs):\n"
             "    raise AssertionError('a member was opened')\n"
             "zipfile.ZipFile.open = refuse\n"
             "from aot_pipeline.cli import main\n"
             "code = main(sys.argv[1:])\n"
             "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
             "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", probe, "partition", "--exported", str(big)],
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (2, "torch not imported\n"), done.stderr
    assert done.stderr == (
        f"aot-pipeline: error: --exported '{big}': its members declare 3221225472 bytes "
        "uncompressed (the largest, 'big/data/0', 3221225472), over the 2147483648 (2 GiB) "
        "--exported reads; refused before reading them (torch.export.load holds a program in "
        "memory about twice over): export the model in a smaller configuration\n")


def test_the_library_path_refuses_it_before_torch_reads_it(tmp_path, monkeypatch):
    import torch
    from aot_pipeline.user_models import ModelSpec, UserModelError

    big = tmp_path / "big.pt2"
    _archive_declaring(big, "big/data/0", 3 << 30, 3 << 30, deflated=False)

    def never(*args, **kwargs):
        raise AssertionError("torch.export.load read the archive")

    monkeypatch.setattr(torch.export, "load", never)
    with pytest.raises(UserModelError, match=r"its members declare 3221225472 bytes "
                                             r"uncompressed .* refused before reading them"):
        ModelSpec("exported", str(big)).build()
