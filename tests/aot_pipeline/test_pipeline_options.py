"""Argument validation of compile(), the back end's options and PipelineOptions."""

from __future__ import annotations

import math

import aot_pipeline
import pytest
import torch
from aot_pipeline import COMPILERS, SOLVERS, PipelineOptionError, PipelineOptions
from aot_pipeline.backend import aot_pipeline_backend, default_options
from torch import nn


@pytest.mark.parametrize("budget", [1.5, -0.1, math.nan, math.inf])
def test_budget_outside_unit_interval_is_refused(budget):
    with pytest.raises(PipelineOptionError, match=r"memory_budget must be in \[0, 1\]"):
        aot_pipeline.compile(nn.Linear(2, 2), memory_budget=budget)


@pytest.mark.parametrize("budget", [True, b"0.5"])
def test_budget_that_is_not_a_number_is_refused(budget):
    with pytest.raises(PipelineOptionError, match="memory_budget must be a number"):
        aot_pipeline.compile(nn.Linear(2, 2), memory_budget=budget)


def test_no_budget_means_the_flags_budget():
    # None is "not given": the partitioner flags decide (1.0 when none is set)
    assert aot_pipeline.compile(nn.Linear(2, 2), memory_budget=None).options.memory_budget == 1.0


def test_budget_as_text_is_a_size():
    options = aot_pipeline.compile(nn.Linear(2, 2), memory_budget="2KiB").options
    assert (options.memory_budget, options.memory_budget_bytes) == (1.0, 2048)


@pytest.mark.parametrize("budget", [0, 0.0, 0.25, 1])
def test_budget_inside_unit_interval_is_accepted(budget):
    compiled = aot_pipeline.compile(nn.Linear(2, 2), memory_budget=budget)
    assert compiled.options.memory_budget == budget


def test_unknown_solver_lists_the_valid_ones():
    with pytest.raises(PipelineOptionError, match="unknown solver 'knap'; choose one of " +
                       ", ".join(SOLVERS)):
        aot_pipeline.compile(nn.Linear(2, 2), solver="knap")


def test_unknown_compiler_lists_the_valid_ones():
    with pytest.raises(PipelineOptionError,
                       match="unknown compiler 'tvm'; choose one of " + ", ".join(COMPILERS)):
        aot_pipeline.compile(nn.Linear(2, 2), compiler="tvm")


def test_option_errors_are_value_errors():
    assert issubclass(PipelineOptionError, ValueError)


def test_compiled_autograd_must_be_a_bool():
    with pytest.raises(PipelineOptionError, match="compiled_autograd must be True or False"):
        aot_pipeline.compile(nn.Linear(2, 2), compiled_autograd="yes")


def test_model_must_be_callable():
    with pytest.raises(TypeError, match="needs an nn.Module or a callable, got int"):
        aot_pipeline.compile(3)


def test_dynamic_must_be_none_or_bool():
    with pytest.raises(TypeError, match="dynamic must be None, True or False"):
        aot_pipeline.compile(nn.Linear(2, 2), dynamic="auto")


def test_backend_options_unknown_key_names_the_valid_ones():
    model = torch.compile(nn.Linear(2, 2), backend="aot_pipeline", options={"budget": 0.5})
    with pytest.raises(Exception, match="unknown aot_pipeline option.*'budget'.*valid options "
                       "are compiled_autograd, compiler, defer_full_gc, memory_budget, "
                       "memory_budget_best_effort, memory_budget_bytes, memory_peak_bytes, "
                       "memory_peak_fraction, solver"):
        model(torch.randn(1, 2))


def test_backend_options_are_validated():
    model = torch.compile(nn.Linear(2, 2), backend="aot_pipeline",
                          options={"memory_budget": 2.0, "compiler": "nop"})
    with pytest.raises(Exception, match=r"memory_budget must be in \[0, 1\]"):
        model(torch.randn(1, 2))


def test_backend_refuses_compiled_autograd_option():
    gm = torch.fx.symbolic_trace(nn.Linear(2, 2))
    with pytest.raises(PipelineOptionError, match="use aot_pipeline.compile"):
        aot_pipeline_backend(gm, [torch.randn(1, 2)], options={"compiled_autograd": True})


def test_defaults_come_from_our_functorch_flags():
    from aot_config import functorch as flags

    with flags.patch(activation_memory_budget=0.3, activation_memory_budget_solver="greedy"):
        assert default_options() == PipelineOptions(memory_budget=0.3, solver="greedy")
    assert default_options().memory_budget == flags.activation_memory_budget


def test_from_mapping_overrides_only_what_is_given():
    base = PipelineOptions(memory_budget=0.2, solver="greedy")
    merged = PipelineOptions.from_mapping({"compiler": "nop"}, base)
    assert merged == PipelineOptions(memory_budget=0.2, solver="greedy", compiler="nop")


NON_STRING_NAMES = ("aot_pipeline option names must be strings, got 1; valid options are "
                    "compiled_autograd, compiler, defer_full_gc, memory_budget, "
                    "memory_budget_best_effort, memory_budget_bytes, memory_peak_bytes, "
                    "memory_peak_fraction, solver, split and "
                    "torch._inductor.config "
                    "settings")


def test_option_names_that_are_not_strings_get_our_error():
    gm = torch.fx.symbolic_trace(nn.Linear(2, 2))
    with pytest.raises(PipelineOptionError) as caught:
        aot_pipeline_backend(gm, [torch.randn(1, 2)], options={1: 2})
    assert str(caught.value) == NON_STRING_NAMES
    with pytest.raises(PipelineOptionError) as caught:
        PipelineOptions.from_mapping({1: 2, "x": 3}, PipelineOptions())
    assert str(caught.value) == NON_STRING_NAMES
    model = torch.compile(nn.Linear(2, 2), backend="aot_pipeline", options={1: 2})
    with pytest.raises(Exception, match=NON_STRING_NAMES):
        model(torch.randn(1, 2))


@pytest.mark.parametrize(("options", "message"), [
    ({"memory_budget": "64KiB", "memory_budget_bytes": 1000},
     "aot_pipeline options memory_budget='64KiB' and memory_budget_bytes=1000 both set the "
     "saved-bytes cap (65536 bytes and 1000 bytes); give it once: memory_budget='64KiB' or "
     "memory_budget_bytes=1000"),
    ({"memory_budget": "20GiB peak", "memory_peak_bytes": 4096},
     "aot_pipeline options memory_budget='20GiB peak' and memory_peak_bytes=4096 both set the "
     "peak cap (21474836480 bytes and 4096 bytes); give it once: memory_budget='20GiB peak' "
     "or memory_peak_bytes=4096"),
    ({"memory_budget": "1GiB peak", "memory_peak_fraction": 0.5},
     "aot_pipeline options memory_budget='1GiB peak' and memory_peak_fraction=0.5 both set the "
     "peak cap (1073741824 bytes and 0.5 of the uncapped peak); give it once: "
     "memory_budget='1GiB peak' or memory_peak_fraction=0.5"),
    ({"memory_budget": 0.5, "memory_budget_bytes": 1000},
     "aot_pipeline options memory_budget=0.5 and memory_budget_bytes=1000 both set the memory "
     "budget, and a cap replaces the fraction (it would be ignored); give one: "
     "memory_budget=0.5 or memory_budget_bytes=1000"),
])
def test_one_options_dict_naming_a_budget_twice_is_refused_naming_both(options, message):
    """Neither form silently wins (the string used to overwrite the field, or a peak fraction
    to undercut the string's bytes): refused before any graph, through every entry point."""
    from aot_pipeline.backend import make_backend

    with pytest.raises(PipelineOptionError) as info:
        make_backend(options)
    assert str(info.value) == message
    with pytest.raises(PipelineOptionError) as info:
        PipelineOptions.from_mapping(options, PipelineOptions())
    assert str(info.value) == message
    torch._dynamo.reset()
    compiled = torch.compile(nn.Linear(2, 2), backend="aot_pipeline",
                             options={"compiler": "nop", **options})
    with pytest.raises(Exception) as wrapped:  # torch.compile wraps what a back end raises
        compiled(torch.randn(1, 2))
    assert str(getattr(wrapped.value, "inner_exception", wrapped.value)) == message


def test_a_budget_given_twice_as_dataclass_fields_is_refused_too():
    with pytest.raises(PipelineOptionError, match=r"memory_budget='64KiB' and "
                                                  r"memory_budget_bytes=1000 both set"):
        PipelineOptions(memory_budget="64KiB", memory_budget_bytes=1000)


def test_the_opposite_case_a_budget_given_twice_alike_or_two_caps_are_honoured():
    from aot_pipeline.backend import resolve_options

    same = resolve_options({"memory_budget": "64KiB", "memory_budget_bytes": 65536})
    assert same.memory_budget_bytes == 65536
    # A saved-bytes cap and a peak cap are two budgets: the partitioner meets both.
    both = resolve_options({"memory_budget": "64KiB", "memory_peak_bytes": 2**20})
    assert (both.memory_budget_bytes, both.memory_peak_bytes) == (65536, 2**20)
    # A fraction of 1.0 limits nothing: it is what a cap leaves the fraction at.
    plain = resolve_options({"memory_budget": 1.0, "memory_budget_bytes": 5})
    assert (plain.memory_budget, plain.memory_budget_bytes) == (1.0, 5)
