"""draw_graph_compile: pictures through aot_partition.draw_graph; pydot is an optional extra."""

from __future__ import annotations

import sys

import pytest
import torch
from aot_compilers import MissingExtraError, draw_graph_compile
from torch._functorch.aot_autograd import aot_function


def f(x):
    return torch.sin(x).cos()


def test_draws_forward_and_backward_and_runs_unchanged(tmp_path, capsys):
    pytest.importorskip("pydot")
    compiler = draw_graph_compile(str(tmp_path / "graph.raw"))
    x = torch.randn(5, requires_grad=True)
    out = aot_function(f, fw_compiler=compiler, bw_compiler=compiler)(x)
    torch.testing.assert_close(out, f(x))
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, -torch.sin(torch.sin(x)) * torch.cos(x))
    forward, backward = (tmp_path / "graph_0.raw").read_text(), (tmp_path / "graph_1.raw").read_text()
    assert "digraph" in forward and "sin" in forward
    assert "tangents_1" in backward
    assert capsys.readouterr().out.count("def forward(") == 2


def test_missing_pydot_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydot", None)  # import pydot now fails
    with pytest.raises(MissingExtraError, match=r"needs pydot.*pip install 'aot-compilers\[draw\]'"):
        draw_graph_compile("graph.svg")


def test_name_must_be_a_file_name():
    with pytest.raises(ValueError, match=r"non-empty file name string, got ''"):
        draw_graph_compile("")
