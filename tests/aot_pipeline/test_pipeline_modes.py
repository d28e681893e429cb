"""``mode=`` and Inductor ``options=`` reach Inductor as with ``backend="inductor"``.

CPU: a custom post-grad pass reads ``torch._inductor.config`` while the forward compiles, then
stops the compile (no C++ is built), for ``backend="inductor"`` and for ours. CUDA (skipped
without a GPU): each mode trains a few steps and matches eager.
"""

from __future__ import annotations

import aot_pipeline
import pytest
import torch
from aot_pipeline import PipelineOptionError
from aot_pipeline.backend import AotPipelinePartitioner, aot_pipeline_backend
from torch import nn
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Every setting any mode changes, read back during the compile.
WATCHED = sorted({key for options in torch._inductor.list_mode_options().values()
                  for key in options} | {"triton.cudagraphs", "max_autotune"})


class _Seen(Exception):
    """Stops the compile once the settings are captured."""


class CaptureConfig(CustomGraphPass):
    def __init__(self) -> None:
        self.seen: dict[str, object] = {}

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.seen = {key: _config_value(key) for key in WATCHED}
        partitioner = inductor_config.custom_partitioner_fn
        self.seen["partitioner"] = type(partitioner).__name__ if partitioner else None
        self.seen["memory_budget"] = getattr(partitioner, "memory_budget", None)
        raise _Seen

    def uuid(self) -> None:
        return None


def _config_value(key: str) -> object:
    value = inductor_config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _settings_during_compile(compile_fn) -> dict[str, object]:
    capture = CaptureConfig()
    with inductor_config.patch(post_grad_custom_post_pass=capture, fx_graph_cache=False):
        compiled = compile_fn(_model())
        with pytest.raises(Exception) as caught:  # Dynamo wraps it in BackendCompilerFailed
            compiled(torch.randn(2, 8))
    assert isinstance(caught.value, _Seen) or isinstance(caught.value.__cause__, _Seen) or \
        "_Seen" in repr(caught.value), caught.value
    torch._dynamo.reset()
    return capture.seen


def _watched(seen: dict[str, object]) -> dict[str, object]:
    return {key: seen[key] for key in WATCHED}


@pytest.mark.parametrize("mode", MODES)
def test_mode_reaches_inductor_as_with_backend_inductor(mode):
    theirs = _settings_during_compile(lambda m: torch.compile(m, backend="inductor", mode=mode))
    ours = _settings_during_compile(lambda m: torch.compile(m, backend="aot_pipeline", mode=mode))
    api = _settings_during_compile(lambda m: aot_pipeline.compile(m, mode=mode))
    assert _watched(ours) == _watched(theirs) == _watched(api)
    expected = torch._inductor.list_mode_options(mode)
    assert {key: ours[key] for key in expected} == expected
    assert theirs["partitioner"] is None
    assert ours["partitioner"] == api["partitioner"] == AotPipelinePartitioner.__name__


def test_inductor_options_reach_inductor_next_to_ours():
    seen = _settings_during_compile(lambda m: torch.compile(
        m, backend="aot_pipeline",
        options={"max_autotune": True, "coordinate-descent-tuning": True, "memory_budget": 0.5}))
    assert seen["max_autotune"] is True and seen["coordinate_descent_tuning"] is True
    assert seen["memory_budget"] == 0.5 and seen["partitioner"] == "AotPipelinePartitioner"

    seen = _settings_during_compile(lambda m: aot_pipeline.compile(
        m, memory_budget=0.25, mode="max-autotune-no-cudagraphs",
        options={"coordinate_descent_tuning": False}))
    assert seen["max_autotune"] is True and seen["coordinate_descent_tuning"] is False
    assert seen["memory_budget"] == 0.25


def test_default_mode_changes_nothing():
    seen = _settings_during_compile(lambda m: torch.compile(m, backend="aot_pipeline"))
    assert _watched(seen) == {key: _config_value(key) for key in WATCHED}


def test_unknown_mode_lists_the_modes():
    with pytest.raises(PipelineOptionError,
                       match="unknown mode 'fast'; choose one of default, .*reduce-overhead, "
                             "max-autotune-no-cudagraphs, max-autotune"):
        aot_pipeline.compile(nn.Linear(2, 2), mode="fast")


def test_unknown_option_is_neither_ours_nor_inductors():
    gm = torch.fx.symbolic_trace(nn.Linear(2, 2))
    with pytest.raises(PipelineOptionError,
                       match=r"unknown aot_pipeline option\(s\) 'max_autotunez' \(did you mean "
                             r"'max_autotune'\?\); valid options are compiled_autograd, compiler, "
                             r"defer_full_gc, memory_budget, memory_budget_best_effort, "
                             r"memory_budget_bytes, memory_peak_bytes, memory_peak_fraction, "
                             r"solver, split or a torch._inductor.config setting"):
        aot_pipeline_backend(gm, [torch.randn(1, 2)], options={"max_autotunez": True})
    with pytest.raises(PipelineOptionError, match="unknown aot_pipeline option.*'nope'"):
        aot_pipeline.compile(nn.Linear(2, 2), options={"nope": 1})


def test_inductor_option_of_the_wrong_type_is_refused():
    with pytest.raises(PipelineOptionError,
                       match="Inductor option 'max_autotune' must be of type bool, got 'yes'"):
        aot_pipeline.compile(nn.Linear(2, 2), options={"max_autotune": "yes"})


def test_our_options_are_not_inductor_options_in_compile():
    with pytest.raises(PipelineOptionError, match="memory_budget are aot_pipeline options"):
        aot_pipeline.compile(nn.Linear(2, 2), options={"memory_budget": 0.5})


def test_our_partitioner_setting_cannot_be_overridden():
    with pytest.raises(PipelineOptionError, match="'custom_partitioner_fn' is set by aot_pipeline"):
        aot_pipeline.compile(nn.Linear(2, 2), options={"custom_partitioner_fn": None})


@pytest.mark.parametrize("compiler", ["nop", "debug_nop"])
def test_mode_and_inductor_options_need_inductor(compiler):
    need = (f"mode='max-autotune' can only be used with compiler='inductor' "
            f"\\(got '{compiler}'\\)")
    with pytest.raises(PipelineOptionError, match=need):
        aot_pipeline.compile(nn.Linear(2, 2), compiler=compiler, mode="max-autotune")
    with pytest.raises(PipelineOptionError, match="Inductor option 'max_autotune' can only be"):
        aot_pipeline.compile(nn.Linear(2, 2), compiler=compiler, options={"max_autotune": True})
    # "default" is no change, so it is fine with any compiler.
    assert aot_pipeline.compile(nn.Linear(2, 2), compiler=compiler, mode="default")


def _train_matches_eager(compile_fn, steps: int = 3) -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
    model.load_state_dict(eager.state_dict())
    compiled = compile_fn(model)
    for step in range(steps):
        x = torch.randn(32, 64, device="cuda")
        want = eager(x)
        want.square().mean().backward()
        got = compiled(x)
        got_copy = got.detach().clone()  # CUDA graph outputs are overwritten by the next replay
        got.square().mean().backward()
        torch.testing.assert_close(got_copy, want.detach(), atol=1e-3, rtol=1e-3,
                                   msg=lambda m, step=step: f"step {step}: {m}")
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(
                p.grad, q.grad, atol=1e-3, rtol=1e-3,
                msg=lambda m, step=step, name=name: f"step {step} {name}: {m}")
        for module in (model, eager):
            for p in module.parameters():
                p.grad = None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_on_cuda_matches_eager(mode):
    _train_matches_eager(lambda m: torch.compile(m, backend="aot_pipeline", mode=mode))
    torch._dynamo.reset()
    _train_matches_eager(lambda m: aot_pipeline.compile(m, mode=mode, memory_budget=0.5))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reduce_overhead_uses_cuda_graphs():
    from torch._dynamo.utils import counters

    counters.clear()
    _train_matches_eager(lambda m: torch.compile(m, backend="aot_pipeline",
                                                 mode="reduce-overhead"), steps=4)
    assert counters["inductor"]["cudagraph_skips"] == 0
    from torch._inductor.cudagraph_trees import get_manager

    assert get_manager(torch.cuda.current_device(), create_if_none_exists=False) is not None
