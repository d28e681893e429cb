"""Small graphs in the core's plain terms, written by hand, shared by the core's tests. Imports
only ``aot_partition.core`` (no torch), so the torch-refusing subprocess tests use it too."""

from __future__ import annotations

from aot_partition.core import CoreGraph, CoreNode


def mlp(mm_runtime: float = 8.0, relu_runtime: float = 1.0) -> CoreGraph:
    """relu(x @ w).sum() and its backward, as a foreign compiler would describe it; the
    backward reads x, w and relu.

    Default save costs (bytes x 1.1 per hop to the backward, at least one hop, doubled when
    every user fuses the value): x 64*1.1 -> 70 (an input: materialized), w 0 (a parameter),
    mm 64*1.1**2 -> 77 (relu fuses into out and g_relu, but mm is a matmul: materialized),
    relu 64*1.1 -> 70, doubled to 140 (all its users fuse it), out 4 (never reaches the backward:
    100 hops -> 4*1.1**100, doubled).
    """
    return CoreGraph((
        CoreNode("x", nbytes=64, category="input", forward=True),
        CoreNode("w", nbytes=256, category="parameter", forward=True),
        CoreNode("mm", ("x", "w"), nbytes=64, category="compute", forward=True,
                 runtime=mm_runtime),
        CoreNode("relu", ("mm",), nbytes=64, category="pointwise", forward=True,
                 runtime=relu_runtime),
        CoreNode("out", ("relu",), nbytes=4, category="reduction", forward=True),
        CoreNode("g", nbytes=4, category="tangent", in_backward=True),
        CoreNode("g_relu", ("g", "relu"), nbytes=64, category="pointwise", in_backward=True),
        CoreNode("g_w", ("x", "g_relu"), nbytes=256, category="compute", in_backward=True,
                 backward=True),
        CoreNode("g_x", ("g_relu", "w"), nbytes=64, category="compute", in_backward=True,
                 backward=True),
    ))
