"""Full garbage collections deferred while the back end compiles (aot_pipeline.gc_deferral)."""

from __future__ import annotations

import gc
import threading

import aot_pipeline
import aot_pipeline._compat as compat
import pytest
import torch
from aot_pipeline.gc_deferral import (
    DEFERRED_GENERATION2_THRESHOLD,
    TORCH_FLAG,
    deferred_threshold,
    full_collections_deferred,
)
from aot_pipeline.options import PipelineOptionError
from torch import nn

DEFAULT = (700, 10, 10)
DEFERRED = (700, 10, DEFERRED_GENERATION2_THRESHOLD)
# torch 2.15 on defers around Dynamo's own compile under this flag; ours then reads it.
TORCH_DEFERS = hasattr(torch._dynamo.config, TORCH_FLAG)


@pytest.fixture(autouse=True)
def default_thresholds():
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(*DEFAULT)
    gc.enable()
    yield
    gc.set_threshold(*saved)
    if not enabled:
        gc.disable()


def test_raised_inside_and_restored_after():
    with full_collections_deferred():
        assert gc.get_threshold() == DEFERRED
    assert gc.get_threshold() == DEFAULT


def test_nested_uses_share_the_outermost_and_an_error_restores():
    with pytest.raises(RuntimeError, match="compile failed"):
        with full_collections_deferred():
            with full_collections_deferred():
                assert gc.get_threshold() == DEFERRED
            assert gc.get_threshold() == DEFERRED  # the inner exit is not the last
            raise RuntimeError("compile failed")
    assert gc.get_threshold() == DEFAULT


def test_off_changes_nothing():
    with full_collections_deferred(enabled=False):
        assert gc.get_threshold() == DEFAULT


def test_thresholds_set_during_the_compile_are_kept():
    with full_collections_deferred():
        gc.set_threshold(500, 5, 5)
    assert gc.get_threshold() == (500, 5, 5)


def test_a_higher_threshold_is_never_lowered_nor_a_disabled_collector_touched():
    gc.set_threshold(700, 10, 5000)
    with full_collections_deferred():
        assert gc.get_threshold() == (700, 10, 5000)
    assert gc.get_threshold() == (700, 10, 5000)
    gc.set_threshold(*DEFAULT)
    gc.disable()
    with full_collections_deferred():
        assert gc.get_threshold() == DEFAULT
    assert gc.get_threshold() == DEFAULT


def test_overlapping_threads_restore_once_both_are_done():
    inside = threading.Barrier(2, timeout=30)
    first_done = threading.Event()
    seen: dict[str, tuple[int, int, int]] = {}

    def first():
        with full_collections_deferred():
            inside.wait()
        first_done.set()

    def second():
        with full_collections_deferred():
            inside.wait()
            assert first_done.wait(30)
            seen["after first left"] = gc.get_threshold()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert seen == {"after first left": DEFERRED}
    assert gc.get_threshold() == DEFAULT


def _thresholds_seen_by_partitioner(monkeypatch) -> list[tuple[int, int, int]]:
    import aot_partition

    seen: list[tuple[int, int, int]] = []
    partition = aot_partition.min_cut_rematerialization_partition

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        return partition(*args, **kwargs)

    monkeypatch.setattr(aot_partition, "min_cut_rematerialization_partition", spy)
    return seen


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))


@pytest.mark.skipif(TORCH_DEFERS, reason="this torch's Dynamo defers around its own compile")
@pytest.mark.parametrize("defer", [True, False])
def test_compile_partitions_with_full_collections_deferred_unless_asked_not(monkeypatch, defer):
    seen = _thresholds_seen_by_partitioner(monkeypatch)
    torch._dynamo.reset()
    compiled = aot_pipeline.compile(_model(), compiler="nop", defer_full_gc=defer)
    compiled(torch.randn(2, 4)).sum().backward()
    assert seen == [DEFERRED if defer else DEFAULT]
    assert gc.get_threshold() == DEFAULT


@pytest.mark.skipif(TORCH_DEFERS, reason="this torch's Dynamo defers around its own compile")
def test_registered_backend_takes_the_option(monkeypatch):
    seen = _thresholds_seen_by_partitioner(monkeypatch)
    torch._dynamo.reset()
    for options in ({"compiler": "nop"}, {"compiler": "nop", "defer_full_gc": False}):
        model = torch.compile(_model(), backend="aot_pipeline", options=options)
        model(torch.randn(2, 4)).sum().backward()
        torch._dynamo.reset()
    assert seen == [DEFERRED, DEFAULT]
    assert gc.get_threshold() == DEFAULT


@pytest.mark.skipif(not TORCH_DEFERS, reason=f"torch._dynamo.config has no {TORCH_FLAG}")
@pytest.mark.parametrize(("flag", "inside"), [(None, DEFAULT), (2000, (700, 10, 2000))])
def test_torchs_flag_sets_the_threshold_or_turns_it_off(monkeypatch, flag, inside):
    seen = _thresholds_seen_by_partitioner(monkeypatch)
    # config.patch, not monkeypatch: monkeypatch's undo deletes a config module's entry.
    with torch._dynamo.config.patch(**{TORCH_FLAG: flag}):
        assert deferred_threshold() == flag
        torch._dynamo.reset()
        compiled = aot_pipeline.compile(_model(), compiler="nop")
        compiled(torch.randn(2, 4)).sum().backward()
    assert seen == [inside]
    assert gc.get_threshold() == DEFAULT


@pytest.mark.skipif(not TORCH_DEFERS, reason=f"torch._dynamo.config has no {TORCH_FLAG}")
def test_a_bad_torch_flag_is_refused_by_name():
    with torch._dynamo.config.patch(**{TORCH_FLAG: "1000"}), pytest.raises(
            ValueError, match=f"torch._dynamo.config.{TORCH_FLAG} must be None or an int >= 0, "
                              "got '1000'"):
        deferred_threshold()


@pytest.mark.skipif(TORCH_DEFERS, reason=f"torch._dynamo.config has {TORCH_FLAG}")
def test_without_torchs_flag_the_default_is_torchs_default():
    assert deferred_threshold() == DEFERRED_GENERATION2_THRESHOLD == 1000


def test_bad_value_is_refused():
    model = torch.compile(_model(), backend="aot_pipeline", options={"defer_full_gc": "yes"})
    with pytest.raises(Exception, match="defer_full_gc must be True or False, got 'yes'"):
        model(torch.randn(2, 4))
    with pytest.raises(PipelineOptionError, match="defer_full_gc must be True or False, got 1"):
        aot_pipeline.compile(_model(), defer_full_gc=1)


@pytest.mark.slow
def test_inductor_compiles_forward_and_lazy_backward_deferred(monkeypatch):
    inner = compat.compile_fx_inner()
    seen: list[tuple[int, int, int]] = []

    def recording_inner(*args, **kwargs):
        seen.append(gc.get_threshold())
        return inner(*args, **kwargs)

    monkeypatch.setattr(compat, "compile_fx_inner", lambda: recording_inner)
    torch._dynamo.reset()
    model = _model()
    compiled = aot_pipeline.compile(model, record_partitions=True)
    inputs = torch.randn(2, 4)
    out = compiled(inputs)
    assert seen == [DEFERRED]  # the forward; the backward compiles at its first call
    assert gc.get_threshold() == DEFAULT
    out.sum().backward()
    assert seen == [DEFERRED, DEFERRED]
    assert gc.get_threshold() == DEFAULT
    expected = _model()
    expected(inputs).sum().backward()
    torch.testing.assert_close(out, expected(inputs))
    for ours, theirs in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)
