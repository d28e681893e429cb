"""The graph-agnostic core checks every field of its plain-data description (issue 27): each
bad value is a CoreGraphError naming the node, the field and what is valid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from aot_partition.core import CoreGraph, CoreGraphError, CoreNode, partition


def graph() -> CoreGraph:
    """x -> sin -> (forward output); the backward reads sin."""
    return CoreGraph((
        CoreNode("x", nbytes=16, category="input", forward=True),
        CoreNode("sin", ("x",), nbytes=16, category="pointwise", forward=True),
        CoreNode("g", nbytes=16, category="tangent", in_backward=True),
        CoreNode("gx", ("g", "sin"), nbytes=16, category="pointwise", in_backward=True,
                 backward=True),
    ))


def error_of(**fields) -> str:
    with pytest.raises(CoreGraphError) as info:
        CoreNode("n", **fields)
    return str(info.value)


def test_inputs_as_a_string_is_not_split_into_letters():
    assert error_of(inputs="xw") == ("node 'n' has inputs 'xw'; must be a tuple of node ids, "
                                     "e.g. ('xw',) for one input")
    assert error_of(inputs=("x", 3)) == "node 'n' has input 3; inputs must be node ids (strings)"
    assert error_of(inputs=5) == ("node 'n' has inputs 5; must be a tuple of node ids, e.g. "
                                  "(5,) for one input")
    assert CoreNode("n", inputs=["x", "w"]).inputs == ("x", "w")  # any iterable of ids


@pytest.mark.parametrize("nbytes", [True, -1, 1.5, 4.0, "8", None, math.nan, 2**63])
def test_nbytes_must_be_a_whole_number(nbytes):
    assert error_of(nbytes=nbytes) == (f"node 'n' has nbytes {nbytes!r}; must be an int from 0 "
                                       "to 9223372036854775807 (the bytes of its output)")


def test_numpy_integers_are_byte_counts():
    assert CoreNode("n", nbytes=np.int64(8)).nbytes == 8


@pytest.mark.parametrize("field", ["forward", "backward", "in_backward", "allow_recompute",
                                   "must_recompute"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_flags_must_be_booleans(field, value):
    assert error_of(**{field: value}) == (f"node 'n' has {field} {value!r}; must be True or "
                                          "False")


@pytest.mark.parametrize("runtime", [math.nan, math.inf, -1.0, True, "1"])
def test_runtime_must_be_finite_and_not_negative(runtime):
    assert error_of(runtime=runtime) == (f"node 'n' has runtime {runtime!r}; must be a finite "
                                         "number >= 0")


@pytest.mark.parametrize("save_cost", [math.nan, -1.0, True, "1"])
def test_save_cost_must_be_a_number_or_inf(save_cost):
    assert error_of(save_cost=save_cost) == (f"node 'n' has save_cost {save_cost!r}; must be >= 0 "
                                             "(math.inf: cannot be saved) or None")
    assert CoreNode("n", save_cost=math.inf).save_cost == math.inf


@pytest.mark.parametrize("ban", ["", 3, True])
def test_ban_must_be_a_reason(ban):
    assert error_of(ban=ban) == (f"node 'n' has ban {ban!r}; must be a non-empty string (the "
                                 "reason) or None")


def test_an_unhashable_category_is_an_unknown_category():
    assert error_of(category=["pointwise"]).startswith(
        "node 'n' has unknown category ['pointwise']; valid categories: input, parameter")


def test_releasing_an_unknown_node_is_an_error():
    with pytest.raises(CoreGraphError, match=r"^release names unknown node 'nope'$"):
        partition(graph(), release=("nope",))
    with pytest.raises(CoreGraphError) as info:
        partition(graph(), release="sin")
    assert str(info.value) == ("release must be a collection of node ids, got 'sin'; e.g. "
                               "('sin',) for one node")
    assert partition(graph(), release=("sin",)).saved == ("x",)  # a known id still works


def test_bans_must_map_ids_to_reasons():
    with pytest.raises(CoreGraphError) as info:
        partition(graph(), bans={"sin": True})
    assert str(info.value) == ("ban of node 'sin' is True; must be a non-empty string (the "
                               "reason)")
    with pytest.raises(CoreGraphError) as info:
        partition(graph(), bans=[("sin", "why")])
    assert str(info.value) == ("bans must be a mapping of node id to reason, got "
                               "[('sin', 'why')]")


def test_call_options_must_be_booleans_and_a_solver_name():
    with pytest.raises(CoreGraphError, match=r"^recompute_views must be True or False, got 1$"):
        partition(graph(), recompute_views=1)
    with pytest.raises(CoreGraphError,
                       match=r"^parameters_are_free must be True or False, got 'no'$"):
        partition(graph(), parameters_are_free="no")
    with pytest.raises(CoreGraphError,
                       match=r"^solver must be a solver name \(a string\), got None$"):
        partition(graph(), solver=None)


def test_a_valid_graph_still_partitions():
    result = partition(graph())
    assert (result.saved, result.cost) == (("x",), 19.0)  # 16 bytes x 1.1**2 hops
