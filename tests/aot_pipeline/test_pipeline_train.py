"""Training loops, saved-byte measurement, joint tracing and tables (no Inductor here)."""

from __future__ import annotations

import pytest
import torch
from aot_pipeline.joint import trace_joint
from aot_pipeline.models import build_model
from aot_pipeline.options import PipelineOptionError
from aot_pipeline.report import format_bytes, format_table, train_table
from aot_pipeline.train import (
    TrainResult,
    TrainSettings,
    eager_saved_bytes,
    losses_agree,
    train_all,
    train_variant,
)
from torch import nn


class SinThenSquare(nn.Module):
    def forward(self, x):
        return torch.sin(x) ** 2


def test_eager_saved_bytes_counts_each_storage_once_and_not_the_inputs():
    x = torch.randn(4, 8, requires_grad=True)
    # sin saves x (the input: alive anyway, 0 B); pow saves sin(x) (128 B); the loss's pow
    # saves its input (128 B) and mean saves nothing: two new float32 storages of 32 elements.
    assert eager_saved_bytes(SinThenSquare(), (x,), lambda out: out.pow(2).mean()) == 2 * 128


def test_eager_saved_bytes_does_not_count_parameters():
    linear = nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    # mm saves x and the (transposed) weight: both alive anyway; the loss's pow saves the
    # output (4 x 8 float32).
    assert eager_saved_bytes(linear, (x,), lambda out: out.pow(2).mean()) == 128


def test_eager_saved_bytes_is_zero_without_autograd():
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert eager_saved_bytes(SinThenSquare(), (x,), lambda out: out.sum()) == 0


def test_train_with_nop_compiler_matches_eager_losses():
    settings = TrainSettings(model="mlp", layers=2, steps=3, compiler="nop", memory_budget=0.5,
                             variants=("eager", "aot_pipeline"))
    eager, ours = train_all(settings, progress=False)
    assert len(eager.losses) == len(ours.losses) == 3
    assert eager.matches_eager and ours.matches_eager
    for got, want in zip(ours.losses, eager.losses):
        assert got == pytest.approx(want, rel=1e-4)
    assert eager.saved_bytes > 0 and ours.saved_bytes > 0
    assert ours.peak_memory_bytes is None  # CPU
    # One more step measured on CPU for every variant; ours also predicted (the unfused model:
    # compiler nop). The command's loss runs eager, outside the compiled model, so the
    # prediction (the compiled graphs) misses the loss's own buffers: here 1 KiB of 10.6.
    assert eager.step_peak_bytes > 0 and eager.predicted_peak_bytes is None
    assert ours.step_peak_bytes - 2048 <= ours.predicted_peak_bytes <= ours.step_peak_bytes


def test_isolated_variants_run_in_fresh_processes_with_the_same_losses(monkeypatch, tmp_path):
    """The CLI's train times each compiled variant's compile cold, in a fresh process with an
    empty Inductor cache (issue 40): the same losses, and errors come back as themselves."""
    import os

    from aot_pipeline import train as train_module

    parent_cache = str(tmp_path / "parent-cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", parent_cache)
    monkeypatch.delenv("AOT_PIPELINE_SHARED_INDUCTOR_CACHE", raising=False)  # cold, as users run
    settings = TrainSettings(model="mlp", layers=2, steps=3, compiler="nop", memory_budget=0.5,
                             variants=("eager", "aot_pipeline"))
    in_process = train_all(settings, progress=False)
    eager, ours = train_all(settings, progress=False, isolated=True)
    assert ours.losses == pytest.approx(in_process[1].losses, rel=1e-6)
    assert eager.matches_eager and ours.matches_eager
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == parent_cache  # the parent's is untouched
    # An error in the child comes back as itself.
    with pytest.raises(PipelineOptionError, match="unknown variant 'jit'"):
        train_module._train_isolated("jit", settings, False)


def test_train_with_compiled_autograd_matches_eager_losses():
    settings = TrainSettings(model="convnet", layers=1, steps=2, compiler="nop",
                             compiled_autograd=True, variants=("eager", "aot_pipeline"))
    eager, ours = train_all(settings, progress=False)
    assert ours.matches_eager, (ours.losses, eager.losses)


def test_train_refuses_unknown_variant_and_bad_steps():
    with pytest.raises(PipelineOptionError, match="unknown variant 'jit'"):
        train_variant("jit", TrainSettings(model="mlp", steps=1))
    with pytest.raises(PipelineOptionError, match="steps must be >= 1, got 0"):
        train_variant("eager", TrainSettings(model="mlp", steps=0))
    with pytest.raises(PipelineOptionError, match="unknown device 'tpu'; choose one of cpu, cuda"):
        train_variant("eager", TrainSettings(model="mlp", device="tpu"))


def test_losses_agree_within_tolerance_only():
    assert losses_agree([1.0, 0.5], [1.0, 0.50001])
    assert not losses_agree([1.0, 0.5], [1.0, 0.51])
    assert not losses_agree([1.0], [1.0, 0.5])


def test_trace_joint_has_primals_tangents_and_forward_outputs():
    built = build_model("mlp", layers=1)
    joint = trace_joint(built.module, built.make_inputs())
    placeholders = [n.name for n in joint.module.graph.find_nodes(op="placeholder")]
    assert joint.num_fwd_outputs == 1
    assert sum(name.startswith("primals") for name in placeholders) == 5  # 4 params + input
    assert sum(name.startswith("tangents") for name in placeholders) == 1


def test_trace_joint_refuses_a_model_without_grad():
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(RuntimeError, match="Linear produced no joint graph"):
        trace_joint(model, (torch.randn(1, 2),))


def test_format_table_aligns_columns():
    table = format_table(["name", "bytes"], [["a", 10], ["longer", 1234]])
    assert table.splitlines() == ["name    bytes",
                                  "------  -----",
                                  "a          10",
                                  "longer   1234"]


@pytest.mark.parametrize(("nbytes", "text"), [(None, "-"), (512, "512 B"), (2048, "2.0 KiB"),
                                              (3 * 2**20, "3.0 MiB")])
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text


def test_train_table_shows_peak_memory_only_when_measured():
    cpu = TrainResult("eager", [1.0, 0.5], 0.1, 0.01, 2048, matches_eager=True)
    assert "peak CUDA memory" not in train_table([cpu])
    gpu = TrainResult("eager", [1.0, 0.5], 0.1, 0.01, 2048, peak_memory_bytes=2**20,
                      matches_eager=False)
    table = train_table([gpu])
    assert "peak CUDA memory" in table and "1.0 MiB" in table and table.endswith("NO")


def test_the_capped_row_trains_ours_under_a_peak_cap_of_the_step():
    """"aot_pipeline_capped": ours under ``capped_budget`` (a share of the uncapped step), the
    losses equal eager's, and the measured and predicted step peaks are within the cap's share
    of the uncapped row's."""
    settings = TrainSettings(model="gpt", layers=1, steps=2, capped_budget="0.9 peak",
                             variants=("eager", "aot_pipeline", "aot_pipeline_capped"))
    eager, ours, capped = train_all(settings, progress=False)
    assert capped.variant == "aot_pipeline_capped" and capped.matches_eager
    assert capped.predicted_peak_bytes is not None
    assert capped.predicted_peak_bytes <= ours.predicted_peak_bytes
    assert capped.step_peak_bytes <= ours.step_peak_bytes * 1.02
    assert settings.pipeline_options(capped=True).memory_peak_fraction == 0.9


def test_train_table_shows_the_measured_and_predicted_step_peak():
    eager = TrainResult("eager", [1.0], 0.1, 0.01, 2048, matches_eager=True,
                        step_peak_bytes=3 * 2**20)
    ours = TrainResult("aot_pipeline", [1.0], 0.1, 0.01, 1024, matches_eager=True,
                       step_peak_bytes=2**20, predicted_peak_bytes=2**20 + 2**19)
    lines = train_table([eager, ours]).splitlines()
    assert "step peak (measured)" in lines[0] and "step peak (predicted)" in lines[0]
    assert "3.0 MiB" in lines[2] and lines[2].split()[-2:] == ["-", "yes"]
    assert "1.0 MiB" in lines[3] and "1.5 MiB" in lines[3]


def test_a_refused_capped_row_says_why_below_the_table():
    eager = TrainResult("eager", [1.0], 0.1, 0.01, 2048, matches_eager=True)
    refused = TrainResult("aot_pipeline_capped", [], float("nan"), float("nan"), None,
                          refusal="step peak cap 10 bytes is unreachable: ...")
    lines = train_table([eager, refused]).splitlines()
    assert lines[3].split() == ["aot_pipeline_capped", *["refused"] * 4, "-"]
    assert lines[4] == "aot_pipeline_capped: step peak cap 10 bytes is unreachable: ..."


def test_a_language_models_training_step_is_its_next_token_loss_in_one_module():
    """train compiles the model and its loss as one module (BuiltModel.training_step()): for
    the built-in LMs the loss is next-token cross-entropy, the labels shifted as transformers
    shifts them (the last position ignored), so the split and a peak cap see the loss."""
    import torch.nn.functional as F
    from aot_pipeline.models import TrainingStep, squared_mean_loss
    from aot_pipeline.train import TRAIN_LM_SIZES

    built = build_model("gpt", vocab=32, dim=16, heads=2, layers=1, seq=8)
    (ids,) = built.make_inputs()
    logits = built.module(ids)
    want = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    step = built.training_step()
    assert isinstance(step, TrainingStep) and step.model is built.module
    torch.testing.assert_close(step(ids), want)
    torch.testing.assert_close(built.loss(logits, (ids,)), want)
    # The rest keep the output's mean square.
    mlp = build_model("mlp")
    (x,) = mlp.make_inputs()
    torch.testing.assert_close(mlp.training_step()(x), squared_mean_loss(mlp.module(x)))
    # train's built-in LMs at a size where the logits make the peak, named in the table.
    spec = TrainSettings(model="gpt", layers=2).spec()
    assert dict(spec.config) == TRAIN_LM_SIZES
    assert spec.label == "gpt (2 layers, vocab 1024, seq 256)"
    assert TrainSettings(model="mlp", layers=1).spec().label == "mlp (1 layers)"


def test_a_shared_cache_keeps_the_callers_and_a_bad_value_is_named(monkeypatch, tmp_path):
    """AOT_PIPELINE_SHARED_INDUCTOR_CACHE=1 (the test suite's setting): the fresh processes
    keep the caller's Inductor cache; unset or 0, each gets an empty one; anything else is
    refused naming the valid values."""
    from aot_pipeline.train import cold_cache_environment

    folder = str(tmp_path / "cold")
    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv("AOT_PIPELINE_SHARED_INDUCTOR_CACHE", raising=False)
        else:
            monkeypatch.setenv("AOT_PIPELINE_SHARED_INDUCTOR_CACHE", value)
        assert cold_cache_environment(folder) == {
            "TORCHINDUCTOR_CACHE_DIR": folder, "TRITON_CACHE_DIR": str(tmp_path / "cold" / "triton")}
    monkeypatch.setenv("AOT_PIPELINE_SHARED_INDUCTOR_CACHE", "1")
    assert cold_cache_environment(folder) == {}
    monkeypatch.setenv("AOT_PIPELINE_SHARED_INDUCTOR_CACHE", "yes")
    with pytest.raises(PipelineOptionError, match=(
            r"AOT_PIPELINE_SHARED_INDUCTOR_CACHE='yes': use 1 \(share the caller's Inductor "
            r"cache\) or 0 \(an empty cache per process, the default\)")):
        cold_cache_environment(folder)
