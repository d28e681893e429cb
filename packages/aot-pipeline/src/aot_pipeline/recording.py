"""Keep the forward/backward graphs a partitioner produced, to measure what the forward saves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from . import _compat


class PartitionedOnly(Exception):  # noqa: N818 - a signal, not a failure
    """Raised by the partition function when its recorder's ``compile_if`` says the graph
    need not be compiled: the plan was partitioned (and priced) to be compared, and another
    may be chosen. Carries nothing: the recorder holds the partition."""


@dataclass
class RecordedPartition:
    """One partitioned joint graph: its forward, its backward and the bytes saved between."""

    forward: fx.GraphModule
    backward: fx.GraphModule | None
    saved_bytes: int
    num_fwd_outputs: int | None = None
    # The graphs as the partitioner returned them (Inductor rewrites the ones it compiles),
    # priced for the step's predicted peak (step_peak.py), and the forward's parameter inputs.
    as_partitioned: tuple[fx.GraphModule, fx.GraphModule] | None = None
    static_input_indices: tuple[int, ...] | None = None


@dataclass
class RecordedJoint:
    """A joint graph as the partitioner received it (a copy), with its inputs and keywords."""

    joint: fx.GraphModule
    inputs: list[Any]
    kwargs: dict[str, Any]


@dataclass
class PartitionRecorder:
    """Collects every partition made while it is attached to a back end (one per graph).

    ``bypass_caches`` (the default) turns Inductor's FX graph cache, and with it AOTAutograd's,
    off for the graphs it records: a cache hit skips the partitioner, so it would see nothing.
    Without it the caches stay on and only graphs partitioned in this process are recorded.
    """

    partitions: list[RecordedPartition] = field(default_factory=list)
    bypass_caches: bool = True
    # The LM-head splits made (aot_partition.split.token_split.SplitDecision) and the losses
    # left whole with the reason (LeftAlone), one entry per site per compiled graph.
    splits: list[Any] = field(default_factory=list)
    split_left_alone: list[Any] = field(default_factory=list)
    # The split decision's probes keep each joint (copied before partitioning) to price the
    # cut the same graph gets without a cap.
    keep_joints: bool = False
    joints: list[RecordedJoint] = field(default_factory=list)
    # Called with this recorder after each partition is recorded: False stops the compile
    # there (``PartitionedOnly``), before Inductor generates and compiles any code. None: the
    # graph is always compiled.
    compile_if: Callable[[PartitionRecorder], bool] | None = None

    def compiles_on(self) -> None:
        """After a partition is recorded: raise ``PartitionedOnly`` if ``compile_if`` says no."""
        if self.compile_if is not None and not self.compile_if(self):
            raise PartitionedOnly()

    def record_joint(self, joint: fx.GraphModule, inputs: Any, kwargs: dict[str, Any]) -> None:
        if self.keep_joints:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            # Outside the compile's fake mode: a joint may hold real tensor constants
            # (transformers' GPT-2 does), which a copy under it cannot clone.
            with unset_fake_temporarily():
                kept = _compat.deepcopy_graph(joint)
            self.joints.append(RecordedJoint(kept, list(inputs), dict(kwargs)))

    def record_forward(self, forward: fx.GraphModule, backward: fx.GraphModule | None = None,
                       num_fwd_outputs: int | None = None,
                       static_input_indices: Any = None, *,
                       as_partitioned: tuple[fx.GraphModule, fx.GraphModule] | None = None
                       ) -> None:
        """Record one partition. ``as_partitioned``: copies already made (a probe compile's,
        adopted); else the graphs are copied now, before Inductor rewrites them."""
        from aot_partition import saved_activation_bytes

        saved = saved_activation_bytes(forward, num_fwd_outputs)
        if as_partitioned is None and backward is not None:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # graphs may hold real tensor constants
                as_partitioned = _compat.deepcopy_graph((forward, backward))
        static = tuple(static_input_indices) if static_input_indices is not None else None
        self.partitions.append(RecordedPartition(forward, backward, saved, num_fwd_outputs,
                                                 as_partitioned, static))

    @property
    def saved_bytes(self) -> int | None:
        """Bytes saved for backward summed over all graphs; None when nothing was partitioned."""
        if not self.partitions:
            return None
        return sum(p.saved_bytes for p in self.partitions)

    def clear(self) -> None:
        self.partitions.clear()
        self.splits.clear()
        self.split_left_alone.clear()
        self.joints.clear()
