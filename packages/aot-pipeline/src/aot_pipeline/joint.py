"""Trace a model's joint forward+backward graph, as AOTAutograd hands it to a partitioner.

``pareto`` and ``partition`` explain what the partitioner does to this graph. It is traced
without decompositions (the graph ``compiler="nop"`` partitions), so nodes keep readable
high-level names such as ``native_layer_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn


@dataclass
class JointGraph:
    module: fx.GraphModule
    inputs: list[Any]
    num_fwd_outputs: int
    # The joint's parameter and buffer inputs (aot_module lifts them first), alive anyway.
    static_input_indices: list[int] = field(default_factory=list)


class _JointCaptured(Exception):
    """Stops AOTAutograd once the partitioner has been handed the joint graph."""

    def __init__(self, joint: JointGraph) -> None:
        super().__init__("joint graph captured")
        self.joint = joint


def trace_joint(module: nn.Module, inputs: Sequence[torch.Tensor]) -> JointGraph:
    """The joint graph of ``module(*inputs)`` with a loss on all its outputs."""
    from torch._functorch.aot_autograd import aot_module

    def capture(joint_module: fx.GraphModule, joint_inputs: Sequence[Any], *,
                num_fwd_outputs: int, **_: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        raise _JointCaptured(JointGraph(joint_module, list(joint_inputs), num_fwd_outputs,
                                        list(range(num_static))))

    def unused_compiler(gm: fx.GraphModule, _: Sequence[Any]) -> fx.GraphModule:
        return gm

    num_static = len(dict(module.named_parameters())) + len(dict(module.named_buffers()))
    traced = aot_module(module, fw_compiler=unused_compiler, partition_fn=capture)
    try:
        traced(*inputs)
    except _JointCaptured as captured:
        return captured.joint
    raise RuntimeError(
        f"{type(module).__name__} produced no joint graph: no output requires grad")


def trace_joints_compiled(module: nn.Module, inputs: Sequence[torch.Tensor]) -> list[JointGraph]:
    """The joint graphs of ``module(*inputs)`` as ``torch.compile`` hands them to a partitioner:
    Dynamo captures the model (tied weights, Python control flow and graph breaks included,
    which a direct ``aot_module`` trace of library models cannot take), and each graph's joint
    is recorded, in the order compiled. Needed for users' models; the built-in ones use
    ``trace_joint``."""
    import copy

    from aot_compilers import nop
    from aot_partition import default_partition
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    joints: list[JointGraph] = []

    def record(joint_module: fx.GraphModule, joint_inputs: Sequence[Any], *,
               num_fwd_outputs: int, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        with unset_fake_temporarily():  # the joint may hold real tensor constants
            # AOTAutograd names the parameter and buffer inputs (static lifetime) for us.
            static = list(kwargs.get("static_lifetime_input_indices") or [])
            joints.append(JointGraph(copy.deepcopy(joint_module), list(joint_inputs),
                                     num_fwd_outputs, static))
        return default_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                 **kwargs)

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return aot_module_simplified(gm, example_inputs, fw_compiler=nop, bw_compiler=nop,
                                     partition_fn=record)

    torch._dynamo.reset()
    try:
        torch.compile(module, backend=backend)(*inputs)
    finally:
        torch._dynamo.reset()
    if not joints:
        raise RuntimeError(
            f"{type(module).__name__} produced no joint graph: no output requires grad")
    return joints
