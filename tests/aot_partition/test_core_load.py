"""load_core_graph on hostile input: each is one CoreGraphError naming the problem (issue 40)."""

from __future__ import annotations

import pytest
from aot_partition.core import load_core_graph
from aot_partition.core.graph import CoreGraph, CoreGraphError
from hypothesis import given, settings
from hypothesis import strategies as st

ONE_NODE = '[{"id": "x", "nbytes": 8, "forward": true}]'


@pytest.mark.parametrize(("source", "message"), [
    ("[" * 50_000 + "]" * 50_000,
     "the JSON text nests deeper than 32 levels; a graph nests three (nodes, a node, its inputs)"),
    # the node and the field named, with what is valid (issue 52)
    ('[{"id": "h", "nbytes": ' + "9" * 5000 + "}]",
     "the JSON text: node 'h' has nbytes of 5000 digits; must be an int from 0 to "
     "9223372036854775807 (the bytes of its output)"),
    ('[{"id": "a"}, {"id": "h", "nbytes": 1' + "0" * 30 + "}]",  # 10**30
     "the JSON text: node 'h' has nbytes of 31 digits; must be an int from 0 to "
     "9223372036854775807 (the bytes of its output)"),
    ('[{"nbytes": ' + "9" * 5000 + "}]",
     "the JSON text: node 0 has nbytes of 5000 digits; must be an int from 0 to "
     "9223372036854775807 (the bytes of its output)"),
    ('[{"id": "h", "inputs": [' + "7" * 40 + "]}]",
     "the JSON text: node 'h' has an integer of 40 digits in inputs; must be an integer of at "
     "most 30 digits"),
    ("[[" + "7" * 40 + "]]",
     "the JSON text: node 0 holds an integer of 40 digits (at most 30); each node is a dict of "
     "CoreNode fields"),
    ('"not json"', "the JSON text: a graph is a list of node objects, got str"),
    ('{"nodes": ' + "7" * 40 + "}", "the JSON text: a graph is a list of node objects, got int"),
    ("not json", "'not json' is not a file; give a file path, or JSON text (it starts with [ or {)"),
    ('{"nodes": [], "nodes": []}', "the JSON text: key 'nodes' is given twice in one object"),
    ("", "load_core_graph got empty text: give JSON text or a file path"),
])
def test_hostile_text_is_one_clear_error(source, message):
    with pytest.raises(CoreGraphError) as info:
        load_core_graph(source)
    assert str(info.value) == message


def test_a_byte_order_mark_is_accepted_in_text_and_files(tmp_path):
    assert load_core_graph("\ufeff[]") == CoreGraph.from_dicts([])
    path = tmp_path / "graph.json"
    path.write_bytes("\ufeff[]".encode())
    assert load_core_graph(path) == CoreGraph.from_dicts([])


def test_a_file_that_is_not_utf8_or_not_a_file_is_named(tmp_path):
    path = tmp_path / "graph.json"
    path.write_bytes(b"\xff\xfe[]")
    with pytest.raises(CoreGraphError, match=r"graph.json is not UTF-8 text: byte 0 is b'\\xff'"):
        load_core_graph(path)
    with pytest.raises(CoreGraphError, match=r"is not a file \(it is a folder\)"):
        load_core_graph(tmp_path)


def test_the_opposite_case_a_valid_graph_loads_from_text_and_file(tmp_path):
    path = tmp_path / "graph.json"
    path.write_text(ONE_NODE)
    assert load_core_graph(ONE_NODE) == load_core_graph(path) == load_core_graph(str(path))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=20).map(lambda v: __import__("json").dumps(v))))
def test_any_text_loads_or_raises_a_core_graph_error(source):
    try:
        load_core_graph(source)
    except CoreGraphError:
        pass
