"""Each compiler end to end on the model zoo: outputs and gradients equal eager PyTorch."""

from __future__ import annotations

import pytest
from aot_compilers import debug_nop, nop, print_compile, simple_ts_compile, ts_compile
from zoo import assert_matches_eager, make_case

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("case", ["mlp", "gpt", "llama", "convnet", "dropout", "views"])
def test_nop_through_aot_module(case, compile_with):
    assert_matches_eager(make_case(case), compile_with.aot_module(nop))


@pytest.mark.parametrize("case", ["gpt_sdpa", "views", "convnet"])
def test_debug_nop_through_aot_module(case, compile_with):
    assert_matches_eager(make_case(case), compile_with.aot_module(debug_nop))


@pytest.mark.parametrize("compiler", [nop, debug_nop, print_compile, ts_compile],
                         ids=["nop", "debug_nop", "print_compile", "ts_compile"])
def test_compilers_through_aot_function(compiler, compile_with):
    assert_matches_eager(make_case("mlp"), compile_with.aot_function(compiler))


def test_print_compile_prints_forward_and_backward_code(capsys, compile_with):
    assert_matches_eager(make_case("mlp"), compile_with.aot_module(print_compile))
    printed = capsys.readouterr().out
    assert printed.count("def forward(") == 2  # one forward graph, one backward graph
    assert "torch.ops.aten.addmm.default" in printed or "torch.ops.aten.mm.default" in printed
    assert "tangents_1" in printed  # the backward graph's incoming gradient


@pytest.mark.parametrize("case,partition", [("gpt", "default"), ("convnet", "min_cut")])
def test_ts_compile_through_aot_module(case, partition, compile_with):
    assert_matches_eager(make_case(case), compile_with.aot_module(ts_compile, partition))


def test_simple_ts_compile_through_aot_module(compile_with):
    assert_matches_eager(make_case("views"), compile_with.aot_module(simple_ts_compile, "default"))
