"""Tuple-valued calls without ``meta['val']`` get one from their ``getitem`` users
(``fx.joint.complete_tuple_values``): Inductor's auto_chunker (torch 2.13) leaves the first
``invoke_subgraph`` of each chunk subgraph without a value, and sizing it failed with
MissingMetadataError (the pipeline's end-to-end case: tests/aot_pipeline/test_torch_chunkers.py)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from aot_partition import MissingMetadataError
from aot_partition.fx.joint import complete_tuple_values
from aot_partition.fx.sizes import node_nbytes


def _split_graph(read: tuple[int, ...]):
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4)
    pair = graph.call_function(torch.ops.aten.split.Tensor, (x, 2))
    outputs = []
    for index in read:
        item = graph.call_function(operator.getitem, (pair, index))
        item.meta["val"] = torch.empty(2)
        outputs.append(item)
    graph.output(tuple(outputs))
    return graph, pair, outputs


def test_a_tuple_is_made_of_its_getitems_values_none_where_unread():
    graph, pair, (second,) = _split_graph(read=(1,))
    with pytest.raises(MissingMetadataError, match=r"'split_tensor' \(aten\.split\.Tensor\) has no meta"):
        node_nbytes(pair)
    assert complete_tuple_values(graph) == [pair]
    assert pair.meta["val"][0] is None and pair.meta["val"][1] is second.meta["val"]
    assert node_nbytes(pair) == 8  # the read output only
    assert complete_tuple_values(graph) == []  # done once


def test_a_call_with_another_reader_is_left_for_the_error_to_name():
    graph = fx.Graph()
    y = graph.placeholder("y")
    y.meta["val"] = torch.empty(4)
    opaque = graph.call_function(torch.ops.aten.relu.default, (y,))
    graph.output(graph.call_function(torch.ops.aten.neg.default, (opaque,)))
    assert complete_tuple_values(graph) == []
    with pytest.raises(MissingMetadataError, match=r"'relu_default' \(aten\.relu\.default\) has no meta"):
        node_nbytes(opaque)
