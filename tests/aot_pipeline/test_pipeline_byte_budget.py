"""Memory budgets written in bytes: parsing, options, the CLI and the back end (issue 16)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from aot_pipeline.options import (
    PipelineOptionError,
    PipelineOptions,
    parse_byte_size,
    parse_memory_budget,
)
from subprocess_limits import SUBPROCESS_TIMEOUT_S

SIZE_HELP = ("write a number and a unit, e.g. '300MiB' or '1.5GB' "
             "(units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)")


@pytest.mark.parametrize(("text", "expected"), [
    ("300MiB", 300 * 2**20), ("300mib", 300 * 2**20), ("1.5GB", 1_500_000_000),
    ("64 KiB", 65536), ("0B", 0), ("2e3kB", 2_000_000), ("1TiB", 2**40),
])
def test_sizes_with_units_are_bytes(text, expected):
    assert parse_byte_size(text) == expected
    assert parse_memory_budget(text) == (1.0, expected)


@pytest.mark.parametrize("text", ["0.5", "1", "0", " 0.25 "])
def test_plain_numbers_are_fractions(text):
    assert parse_memory_budget(text) == (float(text), None)


@pytest.mark.parametrize("text", ["300 furlongs", "MiB", "-1MB", "abc", "1.2.3GB"])
def test_unreadable_sizes_name_the_units(text):
    with pytest.raises(PipelineOptionError) as info:
        parse_byte_size(text)
    assert str(info.value) == f"cannot read size {text!r}: {SIZE_HELP}"
    with pytest.raises(PipelineOptionError) as info:
        parse_memory_budget(text)
    assert str(info.value) == (
        "memory_budget must be a fraction in [0, 1] (e.g. 0.5), a size with a unit (e.g. "
        "'300MiB'; units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB) or a peak cap (e.g. "
        f"'20GiB peak' or '0.8 peak'), got {text!r}")


def test_a_number_above_one_without_a_unit_is_not_taken_for_bytes():
    with pytest.raises(PipelineOptionError, match=r"got 300.0 \(or give a size with a unit, "
                                                  r"e.g. '300MiB', for a cap in bytes\)"):
        parse_memory_budget("300")


def test_options_accept_a_size_and_keep_it_in_bytes():
    options = PipelineOptions(memory_budget="300MiB")
    assert (options.memory_budget, options.memory_budget_bytes) == (1.0, 300 * 2**20)
    mapped = PipelineOptions.from_mapping({"memory_budget": "1KiB"}, PipelineOptions())
    assert mapped.memory_budget_bytes == 1024
    assert PipelineOptions.from_mapping({"memory_budget_bytes": 5}, PipelineOptions()
                                        ).memory_budget_bytes == 5


@pytest.mark.parametrize("bad", [-1, 1.5, "5", True, 2**63])
def test_budget_bytes_must_be_a_whole_number(bad):
    with pytest.raises(PipelineOptionError, match=r"memory_budget_bytes must be a whole number "
                                                  r"of bytes from 0 to 9223372036854775807"):
        PipelineOptions(memory_budget_bytes=bad)


def test_the_byte_cap_is_part_of_the_partitioner_cache_key():
    from aot_pipeline.backend import AotPipelinePartitioner

    plain = AotPipelinePartitioner(1.0, "dp")
    capped = AotPipelinePartitioner(1.0, "dp", memory_budget_bytes=4096)
    assert plain.uuid() != capped.uuid()
    restored = pickle.loads(pickle.dumps(capped))
    assert restored.memory_budget_bytes == 4096 and restored.uuid() == capped.uuid()
    assert repr(capped) == ("AotPipelinePartitioner(memory_budget=1.0, memory_budget_bytes=4096, "
                            "solver='dp')")


def test_cli_checks_a_size_before_importing_torch():
    import json

    probe = ("import json, sys; from aot_pipeline.cli import main; code = main(sys.argv[1:]); "
             "print(json.dumps([code, 'torch' in sys.modules]))")
    result = subprocess.run([sys.executable, "-c", probe, "partition", "--memory-budget",
                             "300 furlongs"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert json.loads(result.stdout) == [2, False]
    assert result.stderr.strip() == (
        "aot-pipeline: error: argument --memory-budget: memory_budget must be a fraction in "
        "[0, 1] (e.g. 0.5), a size with a unit (e.g. '300MiB'; units: B, kB, MB, GB, TB, KiB, "
        "MiB, GiB, TiB) or a peak cap (e.g. '20GiB peak' or '0.8 peak'), got '300 furlongs'")


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    # Weights as plain inputs (not parameters): every saved byte then counts against the cap,
    # as the recorder's saved_activation_bytes counts it.
    h = torch.nn.functional.gelu(x @ w1).sin()
    h = torch.nn.functional.gelu(h @ w2).cos()
    return (h @ w3).square().mean()


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(64, 32), *(torch.randn(n, m, requires_grad=True)
                                   for n, m in ((32, 128), (128, 128), (128, 32)))]


def _saved_bytes_and_grads(budget: float | str) -> tuple[int, list[torch.Tensor], torch.Tensor]:
    import aot_pipeline

    compiled = aot_pipeline.compile(_mlp, memory_budget=budget, compiler="nop")
    inputs = _inputs()
    loss = compiled(*inputs)
    loss.backward()
    assert len(compiled.partitions) == 1
    return (compiled.partitions[0].saved_bytes, [t.grad for t in inputs[1:]], loss.detach())


def test_a_byte_budget_caps_saved_bytes_through_the_pipeline_and_matches_eager():
    optimal, _, _ = _saved_bytes_and_grads(1.0)
    ample, _, _ = _saved_bytes_and_grads(f"{optimal}B")
    assert ample == optimal  # an ample cap must not change the runtime-optimal answer
    cap = optimal // 2
    capped, grads, loss = _saved_bytes_and_grads(f"{cap}B")
    assert capped <= cap < optimal

    inputs = _inputs()
    eager_loss = _mlp(*inputs)
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss.detach())
    for got, want in zip(grads, inputs[1:], strict=True):
        torch.testing.assert_close(got, want.grad)


def test_an_unreachable_byte_budget_names_the_least_reachable_size():
    import aot_pipeline

    def dropout_mlp(x, w1, w2, w3):  # its dropout's mask or RNG state is always saved
        return _mlp(torch.nn.functional.dropout(x, 0.5, training=True), w1, w2, w3)

    compiled = aot_pipeline.compile(dropout_mlp, memory_budget="1B", compiler="nop")
    with pytest.raises(Exception, match=r"activation memory budget 1 bytes is unreachable: the "
                                        r"least this graph can save is \d+ bytes"):
        compiled(*_inputs())
