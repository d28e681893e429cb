"""torch.compile(backend="aot_pipeline") honours torch._functorch.config's budget (issue 27)."""

from __future__ import annotations

import contextlib

import aot_partition
import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import FlagConflictError, saved_activation_bytes
from torch._functorch import config as torch_config

from tests.zoo import make_case


@pytest.fixture
def saved_by_backend(monkeypatch):
    """Compile the gpt case with backend="aot_pipeline" (nop compilers), run a step, return
    the bytes our partitioner's forward saved."""
    saved: list[int] = []
    partition = aot_partition.min_cut_rematerialization_partition

    def recording(joint, inputs, **kwargs):
        fw, bw = partition(joint, inputs, **kwargs)
        saved.append(saved_activation_bytes(fw, kwargs["num_fwd_outputs"]))
        return fw, bw

    monkeypatch.setattr(aot_partition, "min_cut_rematerialization_partition", recording)

    def run() -> int:
        saved.clear()
        case = make_case("gpt")
        torch._dynamo.reset()
        model = torch.compile(case.module, backend="aot_pipeline", options={"compiler": "nop"})
        model(*case.inputs).sum().backward()
        assert len(saved) == 1
        return saved[0]

    return run


def test_torchs_budget_is_honoured_by_the_backend(saved_by_backend):
    full = saved_by_backend()
    with functorch_config.patch(activation_memory_budget=0.5):
        ours = saved_by_backend()
    with torch_config.patch(activation_memory_budget=0.5):
        theirs = saved_by_backend()
    assert theirs == ours < full


def test_nothing_set_is_unchanged(saved_by_backend):
    from aot_pipeline.backend import default_options
    from aot_pipeline.options import PipelineOptions

    assert default_options() == PipelineOptions()
    assert saved_by_backend() > 0


def test_a_conflict_is_reported_at_compile_time(saved_by_backend):
    with torch_config.patch(activation_memory_budget=0.5), \
            functorch_config.patch(activation_memory_budget=0.25), \
            pytest.raises(Exception) as info:
        saved_by_backend()
    # torch.compile wraps a back end's error in BackendCompilerFailed.
    assert isinstance(getattr(info.value, "inner_exception", info.value), FlagConflictError)
    assert ("torch._functorch.config.activation_memory_budget = 0.5 and "
            "aot_config.functorch.activation_memory_budget = 0.25: both are set and they "
            "differ") in str(info.value)


@pytest.mark.skipif(not hasattr(torch.autograd.graph, "region_activation_memory_budget"),
                    reason="region_activation_memory_budget needs torch 2.13+")
def test_region_budgets_reach_the_backend(monkeypatch):
    """Through backend="aot_pipeline": a region 0.0 over the whole forward saves less than
    none, and two regions with different budgets compile and give eager's gradients."""
    saved: list[int] = []
    partition = aot_partition.min_cut_rematerialization_partition

    def recording(joint, inputs, **kwargs):
        fw, bw = partition(joint, inputs, **kwargs)
        saved.append(saved_activation_bytes(fw, kwargs["num_fwd_outputs"]))
        return fw, bw

    monkeypatch.setattr(aot_partition, "min_cut_rematerialization_partition", recording)

    def region(budget):
        if budget is None or not torch.compiler.is_compiling():
            return contextlib.nullcontext()
        if isinstance(budget, float):
            return torch.autograd.graph.region_activation_memory_budget(budget)
        return aot_partition.region_memory_budget(budget)

    def model(budgets, whole=None):
        def fn(x, w1, w2):
            with region(whole):
                with region(budgets[0]):
                    h = torch.relu(x @ w1).sin().cos()
                with region(budgets[1]):
                    h = torch.relu(h @ w2).sin().cos()
                return h.sum()
        return fn

    def step(fn):
        gen = torch.Generator().manual_seed(0)
        args = [torch.randn(32, 32, generator=gen, requires_grad=True) for _ in range(3)]
        torch._dynamo.reset()
        torch.compile(fn, backend="aot_pipeline", options={"compiler": "nop"})(*args).backward()
        return [a.grad for a in args]

    step(model([None, None]))
    step(model([None, None], whole=0.0))
    assert saved[1] < saved[0]
    grads = step(model([0.0, "2KiB"]))
    gen = torch.Generator().manual_seed(0)
    eager = [torch.randn(32, 32, generator=gen, requires_grad=True) for _ in range(3)]
    model([None, None])(*eager).backward()
    for got, want in zip(grads, eager):
        torch.testing.assert_close(got, want.grad)


def test_compile_with_a_budget_under_torchs_different_flag_is_a_conflict():
    import aot_pipeline

    case = make_case("gpt")
    torch._dynamo.reset()
    model = aot_pipeline.compile(case.module, memory_budget=0.7, compiler="nop")
    with torch_config.patch(activation_memory_budget=0.5), pytest.raises(Exception) as info:
        model(*case.inputs)
    assert isinstance(getattr(info.value, "inner_exception", info.value), FlagConflictError)
    assert "aot_config.functorch.activation_memory_budget = 0.7" in str(info.value)


# ---- issue 40: no flag dropped by aot_pipeline.compile, torch.compile options or the CLI ----

def _saved_by_compile(**kwargs) -> int:
    """Bytes our partitioner's forward saves when aot_pipeline.compile(**kwargs) trains gpt."""
    import aot_pipeline

    case = make_case("gpt")
    torch._dynamo.reset()
    model = aot_pipeline.compile(case.module, compiler="nop", **kwargs)
    model(*case.inputs).sum().backward()
    (partition,) = model.partitions
    return partition.saved_bytes


def test_compile_without_a_budget_takes_the_flags():
    full = _saved_by_compile()
    with torch_config.patch(activation_memory_budget=0.5):
        theirs = _saved_by_compile()
    with functorch_config.patch(activation_memory_budget=0.5):
        ours = _saved_by_compile()
    assert theirs == ours == _saved_by_compile(memory_budget=0.5) < full


def test_compile_with_both_flags_set_differently_is_a_conflict():
    import aot_pipeline

    case = make_case("gpt")
    with torch_config.patch(activation_memory_budget=0.5), \
            functorch_config.patch(activation_memory_budget=0.7), \
            pytest.raises(FlagConflictError, match=r"torch._functorch.config.activation_memory_"
                          r"budget = 0.5 and aot_config.functorch.activation_memory_budget = 0.7"):
        aot_pipeline.compile(case.module)


@pytest.mark.parametrize(("kwargs", "flags", "message"), [
    ({"memory_budget": 0.3}, {"activation_memory_budget": 0.5},
     "aot_pipeline option memory_budget=0.3 and the flag "
     "torch._functorch.config.activation_memory_budget = 0.5 disagree"),
    ({"memory_budget": "300MiB"}, {"activation_memory_budget": 0.5},
     "aot_pipeline option memory_budget='300MiB' and the flag "
     "torch._functorch.config.activation_memory_budget = 0.5 disagree"),
    ({"solver": "greedy"}, {"activation_memory_budget_solver": "ilp"},
     "aot_pipeline option solver='greedy' and the flag "
     "torch._functorch.config.activation_memory_budget_solver = 'ilp' disagree"),
])
def test_an_option_a_set_torch_flag_contradicts_is_refused(kwargs, flags, message):
    import aot_pipeline
    from aot_pipeline.backend import OptionFlagConflictError

    case = make_case("gpt")
    with torch_config.patch(**flags), pytest.raises(OptionFlagConflictError) as info:
        aot_pipeline.compile(case.module, **kwargs)
    assert str(info.value) == (message + "; drop the option or unset the flag (or give both "
                               "the same value)")


def test_an_option_our_set_flag_contradicts_is_refused_through_torch_compile():
    from aot_pipeline.backend import OptionFlagConflictError

    case = make_case("gpt")
    torch._dynamo.reset()
    model = torch.compile(case.module, backend="aot_pipeline",
                          options={"compiler": "nop", "memory_budget": "64KiB"})
    with functorch_config.patch(activation_memory_peak_bytes=2**30), \
            pytest.raises(Exception) as info:
        model(*case.inputs)
    error = getattr(info.value, "inner_exception", info.value)
    assert isinstance(error, OptionFlagConflictError)
    assert ("aot_pipeline option memory_budget='64KiB' and the flag "
            "aot_config.functorch.activation_memory_peak_bytes = 1073741824 disagree") in str(error)


def test_an_option_flag_conflict_is_caught_as_the_documented_flag_conflict_error():
    """Code written against the documented FlagConflictError (a framework catching a flag
    mix-up) catches an option that a set flag contradicts too, with the flag's name and both
    values on it."""
    import aot_pipeline

    case = make_case("gpt")
    with torch_config.patch(activation_memory_budget=0.5), \
            pytest.raises(FlagConflictError) as info:
        aot_pipeline.compile(case.module, memory_budget=0.3)
    error = info.value
    assert isinstance(error, aot_pipeline.PipelineOptionError)
    assert (error.name, error.torch_value, error.our_value) == ("activation_memory_budget", 0.5,
                                                                0.3)
    assert str(error) == ("aot_pipeline option memory_budget=0.3 and the flag "
                          "torch._functorch.config.activation_memory_budget = 0.5 disagree; "
                          "drop the option or unset the flag (or give both the same value)")


def test_the_opposite_case_an_option_equal_to_the_set_flag_is_fine():
    with torch_config.patch(activation_memory_budget=0.5):
        assert _saved_by_compile(memory_budget=0.5) == _saved_by_compile()


def test_the_cli_refuses_a_conflict_in_one_line(tmp_path):
    import subprocess
    import sys

    model_file = tmp_path / "sets_flags.py"
    model_file.write_text(
        "import torch, torch._functorch.config as c, aot_config\n"
        "c.activation_memory_budget = 0.5\n"
        "aot_config.functorch.activation_memory_budget = 0.7\n"
        "def model():\n    return torch.nn.Linear(4, 4)\n")
    run_cli = "import sys; from aot_pipeline.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", run_cli, "partition", "--model",
                           f"{model_file}:model", "--input", "2x4"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "aot-pipeline: error: torch._functorch.config.activation_memory_budget = 0.5 and "
        "aot_config.functorch.activation_memory_budget = 0.7: both are set and they differ; "
        "set one of them only (or both to the same value)"]
