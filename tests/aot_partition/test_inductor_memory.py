"""The compiled-program memory model (memory_models/inductor.py, memory_models/pricing.py): the buffers
Inductor's compiled forward and backward allocate, predicted from the partition's graphs, against
the profiler's measured peak of the compiled step (the loss inside the compiled region); the
model that prices a cut, chosen by the caller, named in the report, and its fallback."""

from __future__ import annotations

import warnings

import pytest
import sympy
import torch
from aot_config import functorch as functorch_flags
from aot_partition import explain_partition
from aot_partition.memory_models import inductor as inductor_memory
from aot_partition.memory_models import pricing as memory_models
from aot_partition.memory_models.inductor import (
    InductorMemoryError,
    simulate_compiled_partition,
    sizes_at,
)
from aot_partition.memory_models.pricing import (
    MemoryModelFallbackWarning,
    price_partition,
    resolve_memory_model,
)
from aot_partition.memory_models.simulator import simulate_partition
from compiled_steps import compile_step, tiny_gpt, wide_convnet
from torch import nn

MIB = 2**20


@pytest.fixture(scope="module")
def steps():
    """The tiny GPT's step compiled by Inductor at budgets 1.0 and 0.0, measured."""
    out = {}
    for budget in (1.0, 0.0):
        step = compile_step(tiny_gpt(), budget)
        step.run()
        out[budget] = (step, step.measure())
    return out


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_inductor_model_predicts_the_measured_peak(steps, budget):
    step, measured = steps[budget]
    assert len(step.partitions) == 1
    fw, bw = step.partitions[0]
    predicted = simulate_compiled_partition(fw, bw)
    error = (predicted.peak_above_baseline - measured.peak_bytes) / measured.peak_bytes
    assert abs(error) <= 0.03, (predicted.peak_above_baseline, measured.peak_bytes)
    # What is left after the step (gradients, the loss) too.
    assert predicted.end_bytes - predicted.baseline_bytes == measured.end_bytes


def test_a_multi_output_library_call_peaks_with_its_outputs_and_scratch_together():
    """oneDNN's convolution backward allocates grad input and grad weight, then a scratch the
    size of the weight, and returns a tuple whose items the wrapper binds after freeing the
    call's inputs: the step peaks inside the call with outputs and scratch live together
    (ResNet-18 was 11% under while the model put the scratch before the outputs)."""
    step = compile_step(wide_convnet(), 1.0)
    step.run()
    measured = step.measure()
    predicted = simulate_compiled_partition(*step.partitions[0])
    peak = predicted.steps[predicted.peak_step]
    assert peak.phase == "backward" and peak.op == "workspace", peak
    error = (predicted.peak_above_baseline - measured.peak_bytes) / measured.peak_bytes
    assert abs(error) <= 0.01, (predicted.peak_above_baseline, measured.peak_bytes)


@pytest.mark.cuda
@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_inductor_model_predicts_the_cuda_peak(budget):
    """On a GPU: ``max_memory_allocated`` above the memory allocated before the step, Triton
    kernels, the caching allocator's blocks."""
    step = compile_step(tiny_gpt(vocab=4096, dim=256, layers=2, seq=256, batch=8,
                                 device="cuda"), budget)
    step.run()
    measured = step.measure("cuda")
    predicted = simulate_compiled_partition(*step.partitions[0], allocator="cuda")
    error = (predicted.peak_above_baseline - measured.peak_bytes) / measured.peak_bytes
    assert abs(error) <= 0.05, (predicted.peak_above_baseline, measured.peak_bytes)


def test_eager_model_overestimates_what_inductor_runs(steps):
    """The opposite case, why the compiled model exists: every FX value materialized costs
    far more than Inductor's fused kernels allocate."""
    for budget in (1.0, 0.0):
        step, measured = steps[budget]
        fw, bw = step.partitions[0]
        eager = simulate_partition(fw, bw).peak_above_baseline
        assert eager > 1.05 * measured.peak_bytes, (budget, eager, measured.peak_bytes)


def test_the_timeline_names_inductor_buffers_and_their_fx_nodes(steps):
    step, _ = steps[1.0]
    timeline = simulate_compiled_partition(*step.partitions[0])
    assert timeline.peak_phase == "backward"
    biggest = max(timeline.live_at_peak, key=lambda b: b.nbytes)
    assert biggest.name.startswith(("buf", "primals", "tangents")) or "(" in biggest.name
    assert "Inductor" not in timeline.report() and "peak" in timeline.report()


def test_auto_is_inductor_only_while_inductor_partitions(monkeypatch):
    assert resolve_memory_model("auto") == "eager"
    assert resolve_memory_model("eager") == "eager"
    assert resolve_memory_model("inductor") == "inductor"
    import sys
    import types

    # Inductor's config as it is while Inductor partitions with ours (its patch active); a
    # stand-in module, so the real config's own attribute machinery is left alone.
    partitioning = types.SimpleNamespace(custom_partitioner_fn=object())
    monkeypatch.setitem(sys.modules, "torch._inductor.config", partitioning)
    assert resolve_memory_model("auto") == "inductor"
    partitioning.custom_partitioner_fn = None
    assert resolve_memory_model("auto") == "eager"
    with pytest.raises(ValueError, match="unknown memory model 'fused'; choose one of auto, "
                                         "eager, inductor"):
        resolve_memory_model("fused")


def _mlp_joint(capture, batch=8):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    return capture(module, torch.randn(batch, 16))


def test_a_peak_cap_names_the_model_that_priced_it(capture):
    joint = _mlp_joint(capture)
    for model in ("eager", "inductor"):
        with functorch_flags.patch(activation_memory_model=model):
            report = explain_partition(joint.fresh(), joint.inputs,
                                       num_fwd_outputs=joint.num_fwd_outputs,
                                       peak_bytes=10**9)
        assert report.memory_model == model
        assert f"{model} memory model" in report.format()


def test_an_ample_cap_lowers_one_cut_and_no_cap_lowers_none(capture, monkeypatch):
    joint = _mlp_joint(capture)
    calls = []
    real = memory_models.lower_partition

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(memory_models, "lower_partition", counting)
    with functorch_flags.patch(activation_memory_model="inductor"):
        explain_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                          peak_bytes=10**9)
        assert calls == [1]
        calls.clear()
        explain_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                          memory_budget=0.5)
        assert calls == []


def test_a_graph_inductor_cannot_lower_is_priced_by_the_eager_model_aloud(capture, monkeypatch):
    joint = _mlp_joint(capture)

    def failing(*args, **kwargs):
        raise InductorMemoryError("Inductor could not lower the forward graph for the memory "
                                  "model: RuntimeError: no lowering")

    monkeypatch.setattr(memory_models, "lower_partition", failing)
    with functorch_flags.patch(activation_memory_model="inductor"), \
            pytest.warns(MemoryModelFallbackWarning, match="no lowering; the eager"):
        report = explain_partition(joint.fresh(), joint.inputs,
                                   num_fwd_outputs=joint.num_fwd_outputs, peak_bytes=10**9)
    assert report.memory_model == "eager"


def test_price_partition_refuses_an_unknown_model(capture):
    joint = _mlp_joint(capture)
    from aot_partition import min_cut_rematerialization_partition

    fw, bw = min_cut_rematerialization_partition(joint.fresh(), joint.inputs,
                                                 num_fwd_outputs=joint.num_fwd_outputs)
    with pytest.raises(ValueError, match="model must be 'eager' or 'inductor', got 'auto'"):
        price_partition(fw.graph, bw.graph, "auto")


def _dynamic_partition(batches):
    """An MLP compiled with a symbolic batch (nop compiler): its partition's graphs."""
    import aot_pipeline
    from aot_pipeline.recording import PartitionRecorder

    torch._dynamo.reset()
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    recorder = PartitionRecorder()
    compiled = torch.compile(module, dynamic=True,
                             backend=aot_pipeline.make_backend({"compiler": "nop"}, recorder))
    for batch in batches:
        compiled(torch.randn(batch, 16)).sum().backward()
    torch._dynamo.reset()
    assert len(recorder.partitions) == 1
    return module, recorder.partitions[0]


def _static_peak(module, batch):
    from functorch.compile import aot_module, make_boxed_func

    graphs = {}

    def partition(joint, inputs, *, num_fwd_outputs, **kwargs):
        from aot_partition import min_cut_rematerialization_partition

        fw, bw = min_cut_rematerialization_partition(joint, inputs,
                                                     num_fwd_outputs=num_fwd_outputs, **kwargs)
        graphs["fw"], graphs["bw"] = fw, bw
        return fw, bw

    nop = lambda gm, _: make_boxed_func(gm)  # noqa: E731
    aot_module(module, fw_compiler=nop, bw_compiler=nop, partition_fn=partition)(
        torch.randn(batch, 16))
    return simulate_partition(graphs["fw"], graphs["bw"]).peak_bytes


def test_peak_expressions_give_the_peak_at_every_shape():
    """Under a symbolic batch the timeline's expressions, evaluated at a batch size, give the
    peak that size has: for the eager model that of a static trace at that size; for the
    Inductor model that of the same compiled program replayed at that size (a static trace
    would be another program: Inductor plans buffer reuse by exact sizes)."""
    module, part = _dynamic_partition([4, 6])
    eager = simulate_partition(part.forward, part.backward)
    step = inductor_memory.lower_partition(part.forward, part.backward)
    inductor = step.timeline()
    for timeline in (eager, inductor):
        assert timeline.peak_expressions, "a symbolic batch gives symbolic sizes"
        assert all(isinstance(e, sympy.Expr) for e in timeline.peak_expressions)
    (symbol,) = set().union(*(e.free_symbols for e in eager.peak_expressions))
    for batch in (3, 9, 40):
        def at(timeline, batch=batch):
            return max(int(e.xreplace({symbol: batch})) for e in timeline.peak_expressions)

        assert at(eager) == _static_peak(module, batch), batch
        assert at(inductor) == step.timeline(size_of=sizes_at({symbol: batch})).peak_bytes
    # The expressions are few: dominated run ends are dropped.
    assert len(inductor.peak_expressions) < len(inductor.steps) / 4


def test_static_shapes_have_no_peak_expressions(capture):
    joint = _mlp_joint(capture)
    from aot_partition import min_cut_rematerialization_partition

    fw, bw = min_cut_rematerialization_partition(joint.fresh(), joint.inputs,
                                                 num_fwd_outputs=joint.num_fwd_outputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemoryModelFallbackWarning)
        assert simulate_partition(fw, bw).peak_expressions == ()
