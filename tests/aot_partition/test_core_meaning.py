"""The core checks what a description means, not only its types (issue 28): inputs are never
recomputed, a node reading a backward value is backward, ``release=`` names real non-inputs,
a cycle's message stays short, dict/JSON loading checks like the constructor, and nothing is
written to stderr. Each check has a twin that must not fire."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from aot_partition.core import (
    CoreGraph,
    CoreGraphError,
    CoreNode,
    dump_core_graph,
    load_core_graph,
    partition,
)
from aot_partition.errors import InfeasibleMinCutError


def nodes(**x_fields) -> list[CoreNode]:
    """x -> sin; the backward reads sin. ``x_fields`` replace x's."""
    x = {"nbytes": 16, "category": "input", "forward": True, **x_fields}
    return [
        CoreNode("x", **x),
        CoreNode("sin", ("x",), nbytes=16, category="pointwise", forward=True),
        CoreNode("g", nbytes=16, category="tangent", in_backward=True),
        CoreNode("gx", ("g", "sin"), nbytes=16, category="pointwise", in_backward=True,
                 backward=True),
    ]


def message(build) -> str:
    with pytest.raises(CoreGraphError) as info:
        build()
    return str(info.value)


def test_a_forward_input_must_be_forward():
    assert message(lambda: CoreGraph(tuple(nodes(forward=False)))) == (
        "node 'x' is a forward input (category 'input') but forward=False, in_backward=False; "
        "a forward input has forward=True and in_backward=False (it is saved, never "
        "recomputed)")
    assert message(lambda: CoreGraph(tuple(nodes(category="parameter", forward=False)))) == (
        "node 'x' is a forward input (category 'parameter') but forward=False, "
        "in_backward=False; a forward input has forward=True and in_backward=False (it is "
        "saved, never recomputed)")
    # Twin: forward=True, and the input is saved, not "recomputed".
    result = partition(CoreGraph(tuple(nodes())))
    assert result.decisions["x"].kind != "recomputed"


def test_an_input_reads_nothing():
    graph = [CoreNode("w", nbytes=4, category="parameter", forward=True), *nodes()]
    graph[1] = CoreNode("x", ("w",), nbytes=16, category="input", forward=True)
    assert message(lambda: CoreGraph(tuple(graph))) == (
        "node 'x' is an input (category 'input') but reads 'w'; an input reads nothing (use a "
        "compute category for a value computed from others)")
    graph[1] = CoreNode("x", ("w",), nbytes=16, category="other", forward=True)
    CoreGraph(tuple(graph))  # twin: a computed value may read


@pytest.mark.parametrize("flag", ["allow_recompute", "must_recompute"])
def test_an_input_is_never_recomputed(flag):
    assert message(lambda: CoreNode("x", category="seed", forward=True, **{flag: True})) == (
        f"node 'x' is an input (category 'seed') with {flag}=True; an input is never "
        f"recomputed: drop {flag}")
    CoreNode("x", category="random", forward=True, **{flag: True})  # twin: an op may


def test_a_tangent_is_backward():
    assert message(lambda: CoreNode("g", category="tangent")) == (
        "node 'g' is a tangent (an input of the backward) but forward=False, "
        "in_backward=False; a tangent has in_backward=True and forward=False")
    CoreNode("g", category="tangent", in_backward=True)  # twin


@pytest.mark.parametrize(("fields", "where"), [({"forward": True}, "forward"),
                                                ({}, "not marked in_backward")])
def test_a_node_reading_a_backward_value_is_backward(fields, where):
    graph = [*nodes(), CoreNode("late", ("gx",), nbytes=4, **fields)]
    assert message(lambda: CoreGraph(tuple(graph))) == (
        f"node 'late' reads 'gx', a backward value, but is {where}; a node that reads a "
        "backward value is computed in the backward: set in_backward=True (and forward=False)")
    graph[-1] = CoreNode("late", ("gx",), nbytes=4, in_backward=True)  # twin
    assert partition(CoreGraph(tuple(graph))).decisions["late"].kind == "backward"


def test_release_of_an_input_or_an_unknown_id_raises():
    graph = CoreGraph(tuple(nodes()))
    assert message(lambda: partition(graph, release=("x",))) == (
        "release names 'x', an input (category 'input'); inputs are never recomputed, so "
        "their ban cannot be lifted")
    assert message(lambda: partition(graph, release=("sni",))) == (
        "release names unknown node 'sni'")
    assert message(lambda: partition(graph, release="sin")) == (
        "release must be a collection of node ids, got 'sin'; e.g. ('sin',) for one node")
    # Twin: releasing an op is fine.
    banned = partition(graph, bans={"sin": "kept"})
    assert banned.saved == ("sin",)
    assert partition(graph, bans={"sin": "kept"}, release=("sin",)).saved == ("x",)


def test_a_long_cycle_gives_a_short_message():
    count = 50_000
    ring = tuple(CoreNode(f"n{i}", (f"n{(i + 1) % count}",)) for i in range(count))
    text = message(lambda: CoreGraph(ring))
    assert len(text) < 300, len(text)
    assert text == ("the graph has a cycle of 50000 nodes (each node reads the next): n0 -> n1 "
                    "-> n2 -> n3 -> n4 -> n5 -> n6 -> n7 -> n8 -> n9 -> ... (49991 more)")
    # Twin: a short cycle is listed whole.
    assert message(lambda: CoreGraph((CoreNode("a", ("b",)), CoreNode("b", ("a",))))) == (
        "the graph has a cycle of 2 nodes (each node reads the next): a -> b -> a")


def test_from_dicts_checks_like_the_constructor():
    records = [{"id": "x", "nbytes": 16, "category": "input", "forward": True},
               {"id": "sin", "inputs": ["x"], "nbytes": 16, "category": "pointwise",
                "forward": True, "runtime": 1.5}]
    graph = CoreGraph.from_dicts(records)
    assert graph.nodes[1] == CoreNode("sin", ("x",), nbytes=16, category="pointwise",
                                      forward=True, runtime=1.5)
    assert message(lambda: CoreGraph.from_dicts([*records, {"id": "y", "input": ["x"]}])) == (
        "node 'y' has unknown key 'input'; valid keys: id, inputs, nbytes, category, forward, "
        "backward, in_backward, runtime, ban, allow_recompute, must_recompute, save_cost, "
        "saveable, op, fusible, recomputable, output, trivial")
    assert message(lambda: CoreGraph.from_dicts([{"inputs": []}])) == (
        "node 0 has no 'id'; valid keys: id, inputs, nbytes, category, forward, backward, "
        "in_backward, runtime, ban, allow_recompute, must_recompute, save_cost, saveable, op, "
        "fusible, recomputable, output, trivial")
    assert message(lambda: CoreGraph.from_dicts(["x"])) == (
        "node 0 is a str; each node is a dict of CoreNode fields")
    assert message(lambda: CoreGraph.from_dicts({"id": "x"})) == (
        "a graph is a list of node dicts, got dict")
    assert message(lambda: CoreGraph.from_dicts([{"id": "y", "runtime": math.nan}])) == (
        "node 'y' has runtime nan; must be a finite number >= 0")
    assert message(lambda: CoreGraph.from_dicts([{"id": "y", "nbytes": True}])) == (
        "node 'y' has nbytes True; must be an int from 0 to 9223372036854775807 (the bytes of "
        "its output)")
    assert message(lambda: CoreGraph.from_dicts([{"id": "y", "nbytes": 2**63}])) == (
        "node 'y' has nbytes 9223372036854775808; must be an int from 0 to 9223372036854775807 "
        "(the bytes of its output)")


def test_json_round_trip(tmp_path):
    graph = CoreGraph((
        *nodes(),
        CoreNode("meta", ("x",), category="opaque", forward=True, save_cost=math.inf,
                 ban="side effect"),
        CoreNode("size", ("x",), nbytes=np.int64(8), category="symbolic", forward=True),
    ))
    text = dump_core_graph(graph)
    assert load_core_graph(text) == graph
    path = tmp_path / "graph.json"
    path.write_text(text)
    assert load_core_graph(path) == graph
    assert load_core_graph(str(path)) == graph
    assert partition(load_core_graph(path)).saved == partition(graph).saved
    plain = json.dumps(CoreGraph(tuple(nodes())).to_dicts())  # a bare list loads too
    assert load_core_graph(plain) == CoreGraph(tuple(nodes()))
    assert message(lambda: load_core_graph('{"graph": []}')) == (
        "the JSON text: a graph object has exactly one key, 'nodes'; got ['graph']")
    assert message(lambda: load_core_graph("[{")).startswith("the JSON text is not valid JSON")


def test_infeasible_speaks_core_words_and_writes_nothing_to_stderr(caplog):
    infeasible = (
        CoreNode("x", nbytes=8, category="input", forward=True),
        CoreNode("t", ("x",), category="opaque", forward=True, ban="side effect"),
        CoreNode("g", ("t",), category="pointwise", in_backward=True),
    )
    with caplog.at_level(logging.DEBUG, logger="aot_partition"):
        with pytest.raises(InfeasibleMinCutError) as info:
            partition(infeasible)
    assert str(info.value).endswith(InfeasibleMinCutError.CORE_HINT)
    assert "meta['val']" not in str(info.value) and "MUST_SAVE" not in str(info.value)
    # The solver's line is a debug record (it fires: the check below can fail), never a warning.
    levels = {r.levelno for r in caplog.records if "infinite edges" in r.getMessage()}
    assert levels == {logging.DEBUG}
    # Twin: the fx wording stays the default for fx callers.
    assert str(InfeasibleMinCutError([("n", "why")])).endswith(InfeasibleMinCutError.FX_HINT)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from aot_partition.core import CoreNode, partition
        from aot_partition.errors import InfeasibleMinCutError
        try:
            partition((
                CoreNode("x", nbytes=8, category="input", forward=True),
                CoreNode("t", ("x",), category="opaque", forward=True, ban="side effect"),
                CoreNode("g", ("t",), category="pointwise", in_backward=True),
            ))
        except InfeasibleMinCutError:
            print("raised")
    """)], capture_output=True, text=True, timeout=120)
    assert (done.stdout, done.stderr) == ("raised\n", "")
