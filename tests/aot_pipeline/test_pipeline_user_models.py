"""``aot-pipeline`` on the user's model: a factory, transformers / torchvision / timm by name, and
a saved torch.export program. Compared against a direct partition of the same module and against
eager training; every bad source is one line naming it, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from aot_partition import explain_partition
from aot_pipeline.cli import main
from aot_pipeline.joint import trace_joint
from aot_pipeline.user_models import ModelSpec, UserModelError, parse_input_specs
from torch import nn

FACTORIES = Path(__file__).parent / "user_models" / "tiny_factories.py"
HEADER = re.compile(r"^(?P<label>.+), memory budget (?P<budget>\S+) .*: (?P<saved>\d+) saved "
                    r"\((?P<bytes>[^)]+)\), (?P<recomputed>\d+) recomputed$", re.M)
TINY_GPT2 = "n_layer=1,n_embd=32,n_head=2,vocab_size=64,n_positions=32,bos_token_id=0,eos_token_id=0"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_factory_by_path_is_partitioned_like_the_module_itself(capsys):
    code, out, _ = run(capsys, "partition", "--model", f"{FACTORIES}:mlp", "--memory-budget", "0.5")
    assert code == 0
    header = HEADER.search(out)
    assert header and header["label"] == f"{FACTORIES}:mlp"
    built = ModelSpec("factory", f"{FACTORIES}:mlp").build()
    joint = trace_joint(built.module, built.make_inputs())
    direct = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                               memory_budget=0.5,
                               static_lifetime_input_indices=joint.static_input_indices)
    assert int(header["saved"]) == len(direct.saved)
    assert int(header["recomputed"]) == len(direct.recomputed)


def test_a_factory_by_module_name_with_kwargs_and_inputs(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(FACTORIES.parent))
    code, out, _ = run(capsys, "partition", "--model", "tiny_factories:module_only",
                       "--input", "2x6:int64:50")
    assert code == 0, out
    assert HEADER.search(out)["label"] == "tiny_factories:module_only"
    code, out, _ = run(capsys, "partition", "--model", "tiny_factories:mlp",
                       "--model-config", "width=64")
    # A wider hidden layer: the saved GELU input/output grow with it (2 x 64 float32 each).
    assert code == 0 and "gelu" in out and "512" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", f"{FACTORIES}:not_a_model"],
     f"--model '{FACTORIES}:not_a_model': the factory returned an int; it must return an "
     "nn.Module, or (module, inputs) with inputs a tensor or a tuple of tensors"),
    (["--model", f"{FACTORIES}:wrong_inputs"],
     f"--model '{FACTORIES}:wrong_inputs': the factory's inputs are a list of (str, str); it "
     "must return an nn.Module, or (module, inputs) with inputs a tensor or a tuple of tensors"),
    (["--model", f"{FACTORIES}:raises"],
     f"--model '{FACTORIES}:raises': the factory raised RuntimeError: no weights here"),
    (["--model", f"{FACTORIES}:missing"],
     f"--model '{FACTORIES}:missing': '{FACTORIES}' has no attribute 'missing'"),
    (["--model", f"{FACTORIES}:NOT_CALLABLE"],
     f"--model '{FACTORIES}:NOT_CALLABLE': 'NOT_CALLABLE' is an int, not a callable factory"),
    (["--model", "no_such_package.models:build"],
     "--model 'no_such_package.models:build': importing 'no_such_package.models' failed: "
     "ModuleNotFoundError: No module named 'no_such_package'"),
    (["--model", "/nonexistent/model.py:build"],
     "--model '/nonexistent/model.py:build': no file '/nonexistent/model.py'"),
    (["--model", f"{FACTORIES}:module_only"],
     f"{FACTORIES}:module_only gave no example inputs; pass their shapes with --input, e.g. "
     "--input 2x128:int64"),
    (["--model", f"{FACTORIES}:module_only", "--input", "2x6:complex7"],
     "--input '2x6:complex7': unknown dtype 'complex7'; choose one of bfloat16, bool, double, "
     "float, float16, float32, float64, half, int, int16, int32, int64, int8, long, uint8"),
    (["--model", f"{FACTORIES}:module_only", "--input", "two by six"],
     "--input 'two by six': give a shape such as 2x128, optionally a dtype and, for integers, "
     "an upper bound: 2x128:int64:50257"),
    (["--model", "gpt", "--input", "2x8"],
     "--input is for your own model (--model package.module:factory, --hf, ...), not the "
     "built-in 'gpt'"),
    (["--model", "gpt", "--model-config", "width=3", "--input", "2x8"],
     "--model-config and --input are for your own model (--model package.module:factory, "
     "--hf, ...), not the built-in 'gpt'"),
    (["--model", "gtp"],
     "argument --model: 'gtp' is neither a built-in model (mlp, gpt, llama, convnet) nor a "
     "factory 'package.module:function' / 'path/to/file.py:function'"),
    (["--hf", "gpt2", "--hf-config", "n_layer"],
     "--hf-config 'n_layer': give key=value pairs separated by commas, e.g. "
     "n_layer=2,n_embd=128,n_head=4"),
    (["--torchvision", "resnet_nine_thousand"],
     "--torchvision 'resnet_nine_thousand' is not a torchvision model; e.g. resnet18, "
     "mobilenet_v3_small, efficientnet_b0, vit_b_16"),
    (["--torchvision", "resnet18", "--model-config", "nonsense=3"],
     "--torchvision 'resnet18': TypeError: ResNet.__init__() got an unexpected keyword argument "
     "'nonsense'"),
    (["--timm", "no_such_net"],
     "--timm 'no_such_net' is not a timm model; e.g. resnet18, vit_tiny_patch16_224"),
    (["--hf", "gpt2", "--torchvision", "resnet18"],
     "argument --torchvision: not allowed with argument --hf"),
])
def test_a_bad_model_source_is_one_line_naming_it(capsys, argv, message):
    code, out, err = run(capsys, "partition", *argv)
    assert (code, out) == (2, "")
    assert err == f"aot-pipeline: error: {message}\n"


def test_an_unknown_transformers_architecture_is_named(capsys):
    code, _, err = run(capsys, "partition", "--hf", "no-such-architecture")
    assert code == 2
    assert err.startswith("aot-pipeline: error: --hf 'no-such-architecture': Unrecognized model")
    assert len(err) < 500 and "Traceback" not in err


@pytest.mark.parametrize(("config", "message"), [
    # transformers says "`embed_dim` must be divisible by num_heads": said in the keys given
    ("n_layer=1,n_embd=30,n_head=4",
     "--hf-config n_embd=30,n_head=4: n_embd (30) must be divisible by n_head (4): each "
     "attention head takes an equal share of the width; e.g. n_embd=32"),
    ("n_layer=1,n_embd=128",
     "--hf-config n_embd=128: n_embd (128) must be divisible by n_head (12, its default): each "
     "attention head takes an equal share of the width; e.g. n_embd=132"),
    ("n_layer=1,hidden_size=30,num_attention_heads=4",  # the config's aliases, as typed
     "--hf-config hidden_size=30,num_attention_heads=4: hidden_size (30) must be divisible by "
     "num_attention_heads (4): each attention head takes an equal share of the width; e.g. "
     "hidden_size=32"),
])
def test_a_transformers_config_it_cannot_build_is_named_in_the_keys_given(capsys, config,
                                                                          message):
    pytest.importorskip("transformers")
    code, _, err = run(capsys, "partition", "--hf", "gpt2", "--hf-config", config)
    assert code == 2
    assert err == f"aot-pipeline: error: {message}\n"


def test_a_file_that_is_not_an_exported_program(capsys, tmp_path):
    bad = tmp_path / "model.pt2"
    bad.write_text("not a zip")
    code, _, err = run(capsys, "partition", "--exported", str(bad))
    assert code == 2
    assert err == (f"aot-pipeline: error: --exported '{bad}' is not a saved torch.export program "
                   "(torch.export.save writes a .pt2 zip archive)\n")


def test_an_exported_program_is_partitioned_like_its_module(capsys, tmp_path):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    example = (torch.randn(2, 8),)
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, example), str(path))
    code, out, _ = run(capsys, "partition", "--exported", str(path), "--memory-budget", "0.5")
    assert code == 0
    header = HEADER.search(out)
    assert header["label"] == f"exported:{path}"
    joint = trace_joint(module, example)
    direct = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                               memory_budget=0.5,
                               static_lifetime_input_indices=joint.static_input_indices)
    assert int(header["saved"]) == len(direct.saved)
    assert int(header["recomputed"]) == len(direct.recomputed)
    png = tmp_path / "front.png"
    code, out, _ = run(capsys, "pareto", "--exported", str(path), "--budgets", "1,0",
                       "--output", str(png), "--no-progress", "--no-torch")
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_transformers_gpt2_trains_like_eager_from_the_command_line(capsys, tmp_path):
    """A library model through the whole CLI: tied embeddings and HF's control flow need
    Dynamo's capture; dropout off so that the losses must agree step by step."""
    pytest.importorskip("transformers")
    code, out, err = run(capsys, "train", "--hf", "gpt2", "--hf-config",
                         TINY_GPT2 + ",resid_pdrop=0,embd_pdrop=0,attn_pdrop=0",
                         "--steps", "2", "--variants", "eager,aot_pipeline", "--compiler", "nop",
                         "--memory-budget", "0.5", "--no-progress")
    assert code == 0, err
    assert out.startswith("hf:gpt2, 2 steps on cpu; ours: memory budget 0.5")
    rows = [line for line in out.splitlines() if line.startswith(("eager", "aot_pipeline"))]
    assert len(rows) == 2 and all(row.rstrip().endswith("yes") for row in rows), out


def test_transformers_gpt2_partition_explains_each_graph(capsys):
    pytest.importorskip("transformers")
    code, out, _ = run(capsys, "partition", "--hf", "gpt2", "--hf-config", TINY_GPT2,
                       "--memory-budget", "0.5")
    assert code == 0
    header = HEADER.search(out)
    assert header["label"].startswith("hf:gpt2") and int(header["recomputed"]) > 0


@pytest.mark.parametrize("argv", [
    ["--torchvision", "resnet18", "--model-config", "num_classes=4", "--input", "2x3x32x32"],
    ["--timm", "vit_tiny_patch16_224", "--model-config", "img_size=32,depth=1,num_classes=4"],
])
def test_vision_models_by_name(capsys, argv):
    pytest.importorskip(argv[0][2:])
    code, out, _ = run(capsys, "partition", *argv, "--memory-budget", "0.5")
    assert code == 0
    assert HEADER.search(out)["label"] == f"{argv[0][2:]}:{argv[1]}"


def test_input_specs():
    floats, tokens, mask = parse_input_specs(["2x3", "4x5:int64:7", "2:bool"])
    assert (floats.shape, floats.dtype) == (torch.Size([2, 3]), torch.float32)
    assert (tokens.shape, tokens.dtype) == (torch.Size([4, 5]), torch.int64)
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 7
    assert mask.dtype == torch.bool
    with pytest.raises(UserModelError, match="an upper bound is for integer dtypes"):
        parse_input_specs(["2x3:float32:9"])
