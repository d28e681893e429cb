"""``aot_pipeline.make_backend``: the registered back end with its options bound at the call.

``torch.compile(m, backend=make_backend(options))`` must compile as
``torch.compile(m, backend="aot_pipeline", options=options)`` does; the difference is when the
options are read and checked (at the call, not with the first graph) and when Inductor is
imported (test_pipeline_entry_point.py).
"""

from __future__ import annotations

import aot_pipeline
import pytest
import torch
from aot_config import functorch as flags
from aot_pipeline import PipelineOptionError, PipelineOptions, _compat
from aot_pipeline.backend import aot_pipeline_backend
from aot_pipeline.recording import PartitionRecorder
from zoo import assert_matches_eager, make_case


def _compiled_by(backend):
    def compile_fn(module):
        compiled = torch.compile(module, backend=backend)
        return lambda *args: compiled(*args)
    return compile_fn


@pytest.mark.parametrize("case", ["mlp", "dropout", "llama"])
def test_a_made_backend_matches_eager(case):
    assert_matches_eager(make_case(case), _compiled_by(
        aot_pipeline.make_backend({"memory_budget": 0.5, "compiler": "nop"})))


def test_a_made_backend_partitions_as_aot_pipeline_compile_does():
    # The same model through both public entry points: the same partitions, the same bytes.
    recorder = PartitionRecorder(bypass_caches=True)
    case = make_case("gpt")
    torch.compile(case.module, backend=aot_pipeline.make_backend(
        {"memory_budget": 0.5, "compiler": "nop"}, recorder))(*case.inputs)
    case = make_case("gpt")
    compiled = aot_pipeline.compile(case.module, memory_budget=0.5, compiler="nop")
    compiled(*case.inputs)
    assert recorder.saved_bytes == compiled.saved_activation_bytes > 0
    assert [len(p.forward.graph.nodes) for p in recorder.partitions] == \
        [len(p.forward.graph.nodes) for p in compiled.partitions]


def test_unset_options_come_from_the_flags_at_the_call():
    with flags.patch(activation_memory_budget=0.3, activation_memory_budget_solver="greedy"):
        backend = aot_pipeline.make_backend({"compiler": "nop"})
    assert (backend.options.memory_budget, backend.options.solver) == (0.3, "greedy")
    assert flags.activation_memory_budget != 0.3  # read then, not when a graph comes


def test_pipeline_options_are_used_as_given():
    options = PipelineOptions(memory_budget=0.25, compiler="nop", compiled_autograd=True)
    assert aot_pipeline.make_backend(options).options is options


def test_mode_keyword_sets_the_mode():
    backend = aot_pipeline.make_backend(mode="max-autotune-no-cudagraphs")
    assert backend.options.mode == "max-autotune-no-cudagraphs"
    assert backend.__name__ == "aot_pipeline_inductor"


@pytest.mark.parametrize(("options", "mode", "message"), [
    ({"memory_budgt": 0.5}, None,
     "unknown aot_pipeline option(s) 'memory_budgt' (did you mean 'memory_budget'?)"),
    ({"memory_budget": 2.0}, None, "memory_budget must be in [0, 1]"),
    ({"compiled_autograd": True}, None,
     "compiled_autograd cannot be set through torch.compile options (the backward runs outside "
     "the compiled graph); use aot_pipeline.compile(model, compiled_autograd=True)"),
    ("nop", None, "options must be a dict of option names to values, got str"),
    ({"compiler": "nop"}, "max-autotune",
     "mode='max-autotune' can only be used with compiler='inductor' (got 'nop')"),
])
def test_bad_options_are_refused_at_the_call(options, mode, message):
    # The registered name raises the same, but only inside the first compile.
    with pytest.raises(PipelineOptionError) as raised:
        aot_pipeline.make_backend(options, mode=mode)
    assert message in str(raised.value)


@pytest.mark.slow
def test_a_made_backend_with_inductor_matches_eager(monkeypatch):
    import torch._inductor.compile_fx as inductor_compile_fx

    def refuse(*args, **kwargs):
        raise AssertionError("Inductor's own min-cut partitioner was called")

    monkeypatch.setattr(inductor_compile_fx, "min_cut_rematerialization_partition", refuse)
    recorder = PartitionRecorder(bypass_caches=True)
    assert_matches_eager(make_case("mlp"), _compiled_by(
        aot_pipeline.make_backend({"memory_budget": 0.5}, recorder)), atol=1e-4, rtol=1e-3)
    assert recorder.saved_bytes > 0


# torch.compile(..., name=...) names the compiled region; torch 2.15 passes it on to a
# registered back end (``name=``), 2.13 only to Inductor's own. It reaches torch's compilers as
# ``compile_region_name``.
needs_region_names = pytest.mark.skipif(
    not _compat.compile_region_names_supported(),
    reason="this torch has no compiled region names (torch 2.13 on)")


def _recording_compile_fx(calls):
    def compile_fx(gm, example_inputs, **kwargs):
        calls.append(kwargs.get("compile_region_name"))
        return gm.forward
    return lambda: compile_fx


@needs_region_names
def test_the_region_name_reaches_inductor(monkeypatch):
    calls = []
    monkeypatch.setattr(_compat, "compile_fx", _recording_compile_fx(calls))
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    # As torch 2.15's torch.compile(backend="aot_pipeline", name="block0") calls us.
    aot_pipeline_backend(gm, [torch.randn(1, 2)], name="block0")
    aot_pipeline.make_backend(name="block1")(gm, [torch.randn(1, 2)])
    aot_pipeline.make_backend()(gm, [torch.randn(1, 2)])
    assert calls == ["block0", "block1", None]


@needs_region_names
def test_the_region_name_reaches_aot_autograd_with_other_compilers():
    from torch._dynamo.backends import common  # Dynamo's aot_autograd calls it from there

    seen = []
    real = common.aot_module_simplified

    def recording(*args, **kwargs):
        seen.append(kwargs.get("compile_region_name"))
        return real(*args, **kwargs)

    case = make_case("mlp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common, "aot_module_simplified", recording)
        compiled = torch.compile(case.module, backend=aot_pipeline.make_backend(
            {"compiler": "nop"}, name="mlp"))
        assert torch.allclose(compiled(*case.inputs), case.module(*case.inputs))
    assert seen == ["mlp"]


@needs_region_names
def test_aot_pipeline_compile_names_its_region(monkeypatch):
    calls = []
    monkeypatch.setattr(_compat, "compile_fx", _recording_compile_fx(calls))
    case = make_case("mlp")
    for name in ("mlp", None):
        torch._dynamo.reset()
        compiled = aot_pipeline.compile(case.module, name=name)
        assert torch.allclose(compiled(*case.inputs), case.module(*case.inputs))
    assert calls == ["mlp", None]


def test_a_region_name_that_is_not_text_is_refused():
    for make in (lambda: aot_pipeline.make_backend(name=3),
                 lambda: aot_pipeline.compile(torch.nn.Linear(2, 2), name=3)):
        with pytest.raises(PipelineOptionError,
                           match="^name must be a string naming the compiled region, got 3$"):
            make()


@pytest.mark.skipif(_compat.compile_region_names_supported(), reason="this torch has them")
def test_a_region_name_on_a_torch_without_them_is_refused():
    with pytest.raises(PipelineOptionError, match=r"^name='x' needs torch 2.13 or later"):
        aot_pipeline.make_backend(name="x")
    with pytest.raises(PipelineOptionError, match=r"^name='x' needs torch 2.13 or later"):
        aot_pipeline.compile(torch.nn.Linear(2, 2), name="x")
