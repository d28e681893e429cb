"""The graph-agnostic core on small graphs written by hand (no torch.fx): saved set, reasons
and cut cost against hand-computed expectations, and the bad-input errors by exact message."""

from __future__ import annotations

import math
import re

import pytest
from aot_partition.core import (
    CATEGORIES,
    CoreGraph,
    CoreGraphError,
    CoreNode,
    default_save_costs,
    partition,
)
from aot_partition.errors import InfeasibleMinCutError
from core_graphs import mlp


def test_default_save_costs_by_hand():
    costs = default_save_costs(mlp(), recompute_views=False, parameters_are_free=True)
    by_id = dict(zip((n.id for n in mlp().nodes), costs.tolist()))
    assert by_id["x"] == 70 and by_id["w"] == 0 and by_id["mm"] == 77 and by_id["relu"] == 140
    assert by_id["out"] == 2 * int(4 * 1.1 ** 100)
    paid = default_save_costs(mlp(), recompute_views=False, parameters_are_free=False)
    assert paid[1] == int(256 * 1.1)


def test_mlp_recomputes_the_matmul_from_the_saved_inputs():
    # The backward reads x, w and relu. x and w are inputs (banned: saved); with both saved,
    # mm and relu are recomputed for free: the cut is x (70) + w (0).
    result = partition(mlp())
    assert result.saved == ("x", "w")
    assert result.cost == 70.0
    assert result.saved_bytes == 0  # x and w are inputs: saving them costs no memory
    assert partition(mlp(), bans={"relu": "keep"}).saved_bytes == 64  # relu: computed, saved
    assert result.banned == {"x": "primal input", "w": "primal input"}
    assert {i: (d.kind, d.reason) for i, d in result.decisions.items()} == {
        "x": ("saved", "saved: cut; banned: primal input"),
        "w": ("saved", "saved: cut; banned: primal input"),
        "mm": ("recomputed", "recomputed in backward"),
        "relu": ("recomputed", "recomputed in backward"),
        "out": ("forward", "forward only: not needed by backward"),
        "g": ("backward", "backward only"),
        "g_relu": ("backward", "backward only"),
        "g_w": ("backward", "backward only"),
        "g_x": ("backward", "backward only"),
    }
    assert result.recompute_runtime == 9.0


def test_a_ban_makes_the_cheaper_of_mm_and_relu_saved():
    # mm banned: save mm (77) rather than relu (140); the cut is x + w + mm = 147.
    result = partition(mlp(), bans={"mm": "compute-intensive op"})
    assert result.saved == ("x", "w", "mm")
    assert result.cost == 147.0
    assert result.decisions["mm"].reason == "saved: cut; banned: compute-intensive op"
    assert result.decisions["relu"].kind == "recomputed"
    # The node's own ban wins over the call's; release lifts both.
    nodes = [CoreNode(**{**vars(n), "ban": "own"}) if n.id == "mm" else n for n in mlp().nodes]
    own = partition(CoreGraph(tuple(nodes)), bans={"mm": "call"})
    assert own.banned["mm"] == "own"
    assert partition(CoreGraph(tuple(nodes)), release=["mm"]).saved == ("x", "w")


def test_save_cost_override_and_must_recompute():
    nodes = [CoreNode(**{**vars(n), "save_cost": 1.0}) if n.id == "relu" else n
             for n in mlp().nodes]
    nodes[2] = CoreNode(**{**vars(nodes[2]), "ban": "matmul"})
    result = partition(CoreGraph(tuple(nodes)))
    assert result.saved == ("x", "w", "relu") and result.cost == 71.0
    # must_recompute beats every cost: mm is recomputed although banned (the mark exempts it).
    nodes[2] = CoreNode(**{**vars(nodes[2]), "must_recompute": True})
    forced = partition(CoreGraph(tuple(nodes)))
    assert forced.decisions["mm"].reason == "recomputed in backward (must recompute)"
    assert "mm" not in forced.banned and forced.saved == ("x", "w")


def test_random_and_effectful_are_banned_unless_allowed():
    def graph(category: str, allow: bool) -> CoreGraph:
        return CoreGraph((
            CoreNode("x", nbytes=8, category="input", forward=True),
            CoreNode("r", ("x",), nbytes=8, category=category, forward=True,
                     allow_recompute=allow),
            CoreNode("g", ("r",), nbytes=8, category="pointwise", in_backward=True),
        ))

    assert partition(graph("random", False)).banned["r"] == (
        "random op: recomputing costs a second draw and a saved RNG state")
    assert partition(graph("effectful", False)).banned["r"] == (
        "effectful op: recomputing would repeat its side effect")
    assert "r" not in partition(graph("random", True)).banned


def test_views_are_never_banned_and_unsaveable_under_recompute_views():
    nodes = (
        CoreNode("x", nbytes=8, category="input", forward=True),
        CoreNode("v", ("x",), nbytes=8, category="view", forward=True, ban="heuristic"),
        CoreNode("g", ("v",), nbytes=8, category="pointwise", in_backward=True),
    )
    assert partition(nodes).banned == {"x": "primal input"}
    costs = default_save_costs(CoreGraph(nodes), recompute_views=True, parameters_are_free=True)
    assert math.isinf(costs[1])


def test_solvers_agree():
    assert partition(mlp(), solver="networkx").saved == partition(mlp(), solver="scipy").saved


def test_infeasible_names_the_path():
    nodes = (
        CoreNode("x", nbytes=8, category="input", forward=True),
        CoreNode("t", ("x",), category="opaque", forward=True, ban="side effect"),
        CoreNode("g", ("t",), category="pointwise", in_backward=True),
    )
    with pytest.raises(InfeasibleMinCutError) as info:
        partition(nodes)
    assert info.value.path == [
        ("t", "cannot recompute: side effect"),
        ("t", "cannot save: category 'opaque' (not a tensor)"),
        ("g", "g uses t"),
        ("sink", "must be computed in backward"),
    ]


def test_unknown_input_is_named():
    with pytest.raises(CoreGraphError, match=r"^node 'b' reads unknown input 'nope'$"):
        CoreGraph((CoreNode("a"), CoreNode("b", ("a", "nope"))))


def test_cycle_is_named():
    with pytest.raises(CoreGraphError) as info:
        CoreGraph((CoreNode("a", ("c",)), CoreNode("b", ("a",)), CoreNode("c", ("b",))))
    assert str(info.value) == ("the graph has a cycle of 3 nodes (each node reads the next): "
                                "a -> c -> b -> a")


def test_out_of_order_but_acyclic_is_fine():
    graph = CoreGraph((CoreNode("b", ("a",)), CoreNode("a")))
    assert graph.users == [[], [0]]


def test_unknown_category_lists_the_valid_ones():
    message = (f"node 'mm' has unknown category 'matmul'; valid categories: "
               f"{', '.join(CATEGORIES)}")
    with pytest.raises(CoreGraphError, match=f"^{re.escape(message)}$"):
        CoreNode("mm", category="matmul")
    assert "input, parameter, seed, tangent, view, pointwise" in message


def test_other_bad_input():
    with pytest.raises(CoreGraphError, match=r"^duplicate node id 'a' \(nodes 0 and 1\)$"):
        CoreGraph((CoreNode("a"), CoreNode("a")))
    with pytest.raises(CoreGraphError, match=r"^node 'a' has nbytes -1; must be an int from 0 to 9223372036854775807 \(the bytes of its output\)$"):
        CoreNode("a", nbytes=-1)
    with pytest.raises(CoreGraphError, match=r"^ban names unknown node 'zz'$"):
        partition(mlp(), bans={"zz": "why"})
    with pytest.raises(ValueError, match=r"^unknown min-cut solver 'nope'"):
        partition(mlp(), solver="nope")


def test_the_readme_example_runs_and_prints_what_it_says(capsys):
    """The foreign-compiler example of packages/aot-partition/README.md, run as written."""
    from pathlib import Path

    readme = Path(__file__).parents[2] / "packages" / "aot-partition" / "README.md"
    section = readme.read_text().split("## A graph-agnostic core", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "README example", "exec"), {})  # noqa: S102 - our own README
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "('x', 'w', 'mm') 147.0"
    assert any(line.split()[:2] == ["mm", "saved"] for line in lines[1:]), lines
