"""Pareto sweep rows, the PNG behind the visualize flag, and graph drawing."""

from __future__ import annotations

import builtins
import os

import aot_partition
import pytest
from aot_config import functorch as functorch_config
from aot_partition.report.draw import draw_graph, plot_pareto
from aot_partition.report.pareto import ParetoPoint, memory_budget_pareto
from zoo import make_case


@pytest.fixture
def gpt_joint(capture):
    case = make_case("gpt")
    return capture(case.module, *case.inputs)


def test_sweep_rows_trade_memory_for_recompute(gpt_joint):
    before = len(gpt_joint.module.graph.nodes)
    points = memory_budget_pareto(gpt_joint.module, gpt_joint.inputs,
                                  num_fwd_outputs=gpt_joint.num_fwd_outputs,
                                  budgets=[1.0, 0.6, 0.3, 0.0])
    assert len(gpt_joint.module.graph.nodes) == before  # the caller's graph is not touched
    assert [p.budget for p in points] == [1.0, 0.6, 0.3, 0.0]
    assert points[0].memory_ratio == 1.0 and points[0].recompute_runtime == 0.0
    assert points[-1].memory_ratio == 0.0
    ratios = [p.memory_ratio for p in points]
    assert ratios == sorted(ratios, reverse=True)
    saved = [p.saved_bytes for p in points]
    assert saved == sorted(saved, reverse=True) and saved[-1] < saved[0]
    recompute = [p.recompute_runtime for p in points[1:-1]]
    assert recompute == sorted(recompute)
    assert aot_partition.memory_budget_pareto is memory_budget_pareto


def test_default_sweep_has_21_budgets(gpt_joint):
    points = memory_budget_pareto(gpt_joint.module, None,
                                  num_fwd_outputs=gpt_joint.num_fwd_outputs)
    assert [round(p.budget, 2) for p in points] == [round(1 - i / 20, 2) for i in range(21)]


def test_visualize_flag_writes_png(gpt_joint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with functorch_config.patch(visualize_memory_budget_pareto=True):
        memory_budget_pareto(gpt_joint.module, None, num_fwd_outputs=gpt_joint.num_fwd_outputs,
                             budgets=[1.0, 0.5, 0.0])
    pngs = list(tmp_path.glob("memory_budget_pareto_*.png"))
    assert len(pngs) == 1
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_pareto_several_labels(tmp_path):
    points = [ParetoPoint(1.0, 0.0, 1.0, 100, 3), ParetoPoint(0.5, 10.0, 0.4, 60, 2)]
    path = plot_pareto({"ours": points, "torch": points[::-1]}, str(tmp_path / "out" / "p.png"))
    assert os.path.getsize(path) > 1000
    with pytest.raises(ValueError, match="no series to plot"):
        plot_pareto({}, str(tmp_path / "empty.png"))


def test_draw_graph_writes_dot_source(gpt_joint, tmp_path):
    path = draw_graph(gpt_joint.module, str(tmp_path / "joint.raw"))
    text = open(path).read()
    assert "digraph" in text and "addmm" in text
    assert aot_partition.draw_graph is draw_graph
    with pytest.raises(ValueError, match="unknown picture format 'nope'"):
        draw_graph(gpt_joint.module, str(tmp_path / "joint.nope"))


def test_missing_extras_are_named(gpt_joint, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_plotting(name, *args, **kwargs):
        if name.split(".")[0] in ("pydot", "matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plotting)
    monkeypatch.delitem(__import__("sys").modules, "pydot", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "matplotlib", raising=False)
    with pytest.raises(ImportError, match=r"aot-partition\[draw\]"):
        draw_graph(gpt_joint.module, str(tmp_path / "g.raw"))
    with pytest.raises(ImportError, match=r"aot-partition\[plot\]"):
        plot_pareto({"x": [ParetoPoint(1.0, 0.0, 1.0, 1, 1)]}, str(tmp_path / "p.png"))


def test_full_sweep_is_monotone_with_ratios_in_unit_range(capture):
    # A one-block GPT once gave a negative ratio and more bytes at 0.0 than at 0.05: the seed's
    # "inputs only" answer for budget 0 is not always the least memory.
    from aot_pipeline.models import build_model

    built = build_model("gpt", layers=1)
    joint = capture(built.module, *built.make_inputs())
    points = memory_budget_pareto(joint.module, None, num_fwd_outputs=joint.num_fwd_outputs)
    saved = [p.saved_bytes for p in points]
    assert saved == sorted(saved, reverse=True)
    assert all(0.0 <= p.memory_ratio <= 1.0 for p in points), [p.memory_ratio for p in points]
