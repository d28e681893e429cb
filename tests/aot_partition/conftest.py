"""Fixtures for the aot_partition tests: nop compilers and joint-graph capture."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.fx as fx
from functorch.compile import aot_function, aot_module, make_boxed_func
from torch._functorch import partitioners as torch_partitioners


def _nop(gm: fx.GraphModule, _example_inputs: Any) -> Callable:
    return make_boxed_func(gm)


@dataclass
class CapturedJoint:
    """A joint graph as AOTAutograd hands it to partition_fn; ``fresh()`` gives a copy."""

    module: fx.GraphModule
    inputs: Any
    num_fwd_outputs: int

    def fresh(self) -> fx.GraphModule:
        return copy.deepcopy(self.module)

    def node(self, name: str) -> fx.Node:
        return next(n for n in self.module.graph.nodes if n.name == name)


def capture_joint(fn: Callable | torch.nn.Module, *inputs: torch.Tensor) -> CapturedJoint:
    """Trace ``fn`` with AOTAutograd and return its joint graph (run once, split by torch)."""
    record: dict[str, CapturedJoint] = {}

    def recording_partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        record["joint"] = CapturedJoint(copy.deepcopy(joint), joint_inputs, num_fwd_outputs)
        return torch_partitioners.default_partition(
            joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    if isinstance(fn, torch.nn.Module):
        compiled = aot_module(fn, fw_compiler=_nop, bw_compiler=_nop,
                              partition_fn=recording_partition)
    else:
        compiled = aot_function(fn, fw_compiler=_nop, bw_compiler=_nop,
                                partition_fn=recording_partition)
    compiled(*inputs)
    return record["joint"]


@pytest.fixture
def nop_compiler() -> Callable:
    return _nop


@pytest.fixture
def aot_with() -> Callable[[Callable], Callable[[torch.nn.Module], Callable]]:
    """``aot_with(partition_fn)`` -> a compile_fn for ``zoo.assert_matches_eager``."""

    def make(partition_fn: Callable) -> Callable[[torch.nn.Module], Callable]:
        return lambda module: aot_module(module, fw_compiler=_nop, bw_compiler=_nop,
                                         partition_fn=partition_fn)

    return make


@pytest.fixture(scope="session")
def capture() -> Callable[..., CapturedJoint]:
    return capture_joint


@pytest.fixture
def split_with_recording() -> Callable:
    """``wrap(partition_fn)`` -> (partition_fn that records its fw/bw modules, records list)."""

    def wrap(partition_fn: Callable) -> tuple[Callable, list]:
        records: list[tuple[fx.GraphModule, fx.GraphModule, int]] = []

        def recording(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
            fw, bw = partition_fn(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
            records.append((fw, bw, num_fwd_outputs))
            return fw, bw

        return recording, records

    return wrap
