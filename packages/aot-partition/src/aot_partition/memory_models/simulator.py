"""Memory of one training step, simulated from the partitioned forward and backward graphs.

The model follows how the graphs run eagerly (fx code generation, AOTAutograd's runtime):

- The forward's inputs exist before the step and the caller holds them to its end; the
  static-lifetime ones (parameters, buffers) are "parameter", the rest "input".
- Each node allocates its outputs when it runs. A view or alias (its fake tensor shares a
  storage with one of the node's inputs; without fake storages, the op schema's alias
  annotation) allocates nothing and keeps its base alive. A value is freed after its last use,
  as fx code generation writes ``x = None`` there; a buffer is freed when no value holds it.
- The forward returns user outputs + saved tensors (+ saved symbolic scalars, no bytes). The
  caller keeps the user outputs to the end of the step; saved tensors become backward inputs.
- An offloaded value (fx/offload.py) is freed from the device after ``wait_offload`` (its copy
  out done) and allocated again at ``prefetch_to_device``; its host copy holds no device bytes.
  Each copy is a ``Transfer`` of the timeline: bytes, estimated seconds, hidden and exposed.
- The backward's tangents are allocated when it starts; its boxed call clears its argument list,
  so saved values and tangents die after their last backward use. Gradients live to the end.

Sizes come from ``meta["val"]`` (the storage's bytes, so a saved view keeps its whole base);
symbolic sizes are replaced by their hints. ``measure_partition`` runs the two graphs for real
and returns the peak the allocator saw, to check the model against.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import py_sym_types

from ..costs.estimators import _signature
from ..fx._compat import check_real_tensors, real_kernels
from ..fx.joint import is_backward_state, is_bwd_seed_offset, is_random, is_tangent
from ..fx.passes.offload_ops import OFFLOAD_META, offload_to_host
from ..fx.passes.reorder import _backward_order
from ..fx.profiled_peak import profiled_cpu_peak
from ..fx.sizes import (
    has_no_result,
    saved_bytes,
    schema_alias_arg,
    size_hint,
    storage_key,
    storage_nbytes,
    storage_nbytes_expr,
    value_leaves,
)

if TYPE_CHECKING:
    from ..fx.extract import CutPlan

log = logging.getLogger(__name__)

__all__ = [
    "KINDS",
    "LeafFacts",
    "LiveBuffer",
    "MeasuredMemory",
    "MemoryStep",
    "MemoryTimeline",
    "Transfer",
    "clear_workspace_cache",
    "example_value",
    "measure_partition",
    "measure_peak",
    "profiled_workspace",
    "split_op_workspace",
    "simulate_joint",
    "simulate_partition",
    "simulate_plan",
]

# What a live buffer is, in the order the plot stacks them.
KINDS = ("parameter", "input", "tangent", "saved", "output", "gradient", "temporary",
         "workspace")

GraphLike = fx.Graph | fx.GraphModule
# Bytes an op allocates and frees while it runs (on top of its outputs), per node.
WorkspaceFn = Callable[[fx.Node], int]


# ---- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryStep:
    """One node run (or the tangents arriving, or a graph returning)."""

    phase: str            # "forward" or "backward"
    node: str
    op: str
    allocated: int        # bytes this step allocated
    freed: int            # bytes freed after it (inputs past their last use)
    high_bytes: int       # live bytes right after the allocation, before the frees
    live_bytes: int       # live bytes after the frees
    high_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LiveBuffer:
    """A buffer live at the peak: the node that allocated it, its bytes and its kind."""

    name: str
    nbytes: int
    kind: str


@dataclass(frozen=True)
class Transfer:
    """One copy of an offloaded value between the device and host memory."""

    value: str            # the offloaded value
    direction: str        # "to_host" (forward) or "to_device" (backward prefetch)
    node: str             # the node issuing the copy
    nbytes: int
    seconds: float        # estimated at the host link's bandwidth
    hidden_seconds: float  # compute it overlaps (roofline)

    @property
    def exposed_seconds(self) -> float:
        return max(0.0, self.seconds - self.hidden_seconds)


@dataclass
class MemoryTimeline:
    """The simulated memory of one forward + backward step (bytes include the inputs)."""

    steps: list[MemoryStep]
    peak_bytes: int
    peak_step: int
    live_at_peak: list[LiveBuffer]
    baseline_bytes: int   # forward inputs: allocated before the step
    parameter_bytes: int  # the static-lifetime share of the baseline
    # What the saved values keep alive beyond the inputs (views: their bases, once): the one
    # measure, sizes.saved_bytes, unaligned.
    saved_bytes: int
    end_bytes: int        # live after the backward: inputs, user outputs, gradients
    transfers: list[Transfer] = field(default_factory=list)  # offload copies, in run order
    # Under dynamic shapes: the absolute peak at every shape is the largest of these sympy
    # expressions of the shape symbols (symbolic_peak.py); empty when the sizes are static.
    peak_expressions: tuple[Any, ...] = ()

    @property
    def offloaded_bytes(self) -> int:
        """Bytes copied to host memory in the forward (each offloaded value once)."""
        return sum(t.nbytes for t in self.transfers if t.direction == "to_host")

    @property
    def exposed_transfer_seconds(self) -> float:
        """Estimated copy time no compute hides, both directions."""
        return sum(t.exposed_seconds for t in self.transfers)

    @property
    def peak_phase(self) -> str:
        return self.steps[self.peak_step].phase if self.steps else "forward"

    @property
    def peak_node(self) -> str:
        return self.steps[self.peak_step].node if self.steps else ""

    @property
    def peak_above_baseline(self) -> int:
        """The peak minus what existed before the step: what a measurement relative to the
        memory allocated before the step sees."""
        return self.peak_bytes - self.baseline_bytes

    def peak_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for buf in self.live_at_peak:
            out[buf.kind] += buf.nbytes
        return {k: v for k, v in out.items() if v}

    def report(self, top: int = 8) -> str:
        """A few lines: peak, where, what is live there by kind, the biggest buffers."""
        mib = 2**20
        lines = [
            f"peak {self.peak_bytes / mib:.3f} MiB ({self.peak_above_baseline / mib:.3f} MiB "
            f"above the inputs) at {self.peak_phase} node '{self.peak_node}' "
            f"(step {self.peak_step} of {len(self.steps)})",
            f"inputs {self.baseline_bytes / mib:.3f} MiB (parameters "
            f"{self.parameter_bytes / mib:.3f}), saved activations {self.saved_bytes / mib:.3f} "
            f"MiB, live at the end {self.end_bytes / mib:.3f} MiB",
            "live at the peak: " + ", ".join(
                f"{k} {v / mib:.3f} MiB" for k, v in self.peak_by_kind().items()),
        ]
        biggest = sorted(self.live_at_peak, key=lambda b: -b.nbytes)[:top]
        lines += [f"  {b.name:<32} {b.kind:<10} {b.nbytes:>12,d} B" for b in biggest]
        return "\n".join(lines)


# ---- buffers ----------------------------------------------------------------------------------

@dataclass(eq=False)
class _Buffer:
    id: int
    name: str
    nbytes: int
    origin: str           # parameter / input / tangent / computed
    refs: int = 0
    roles: set[str] = field(default_factory=set)  # saved / output / gradient
    expr: Any = None      # the bytes as a sympy expression of shape symbols; None: static

    def kind(self) -> str:
        if self.origin != "computed":
            return self.origin
        for role in ("gradient", "output", "saved"):
            if role in self.roles:
                return role
        return "temporary"


# How blocks are counted: None, each buffer's bytes (rounded to ``alignment``); "cuda", as the
# CUDA caching allocator hands them out (caching_allocator.py: rounding, unsplit blocks).
ALLOCATORS = (None, "cuda")

# A value: (fake storage key or None, buffer) per tensor it holds (tuples hold several).
_Value = list[tuple[int | None, _Buffer]]


@dataclass
class _RawStep:
    phase: str
    node: str
    op: str
    allocated: list[_Buffer]
    freed: list[_Buffer]
    workspace: int = 0    # bytes the op allocates and frees while it runs


class _Memory:
    """Live buffers, reference counted by the values (and callers) holding them."""

    def __init__(self, alignment: int, allocator: str | None = None) -> None:
        if allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(map(repr, ALLOCATORS))}, "
                             f"got {allocator!r}")
        # The CUDA caching allocator rounds every request to 512 bytes (and more: see _timeline)
        self.alignment = max(1, alignment, 512 if allocator == "cuda" else 1)
        self.allocator = allocator
        self.buffers: list[_Buffer] = []
        self.raw: list[_RawStep] = []
        self._pending_alloc: list[_Buffer] = []
        self._pending_free: list[_Buffer] = []
        self.transfers: list[Transfer] = []

    def new(self, name: str, nbytes: int, origin: str, expr: Any = None) -> _Buffer:
        """A buffer of ``nbytes`` (hinted); ``expr``: its size at every shape (sympy), for
        the peak's expressions under dynamic shapes (an int or None: static)."""
        if nbytes > 0:  # allocators round up to their block size
            nbytes = -(-nbytes // self.alignment) * self.alignment
        if isinstance(expr, int):
            expr = None
        elif expr is not None and self.alignment > 1:
            from torch.utils._sympy.functions import FloorDiv

            expr = FloorDiv(expr + (self.alignment - 1), self.alignment) * self.alignment
        buf = _Buffer(len(self.buffers), name, nbytes, origin, expr=expr)
        self.buffers.append(buf)
        if origin in ("computed", "tangent"):  # inputs exist before the step
            self._pending_alloc.append(buf)
        return buf

    def hold(self, value: _Value) -> None:
        for _, buf in value:
            buf.refs += 1

    def drop(self, value: _Value) -> None:
        for _, buf in value:
            buf.refs -= 1
            if buf.refs == 0:
                self._pending_free.append(buf)

    def step(self, phase: str, node: str, op: str, workspace: int = 0) -> None:
        """Close a step: what was allocated since the last one, then what was freed."""
        self.raw.append(_RawStep(phase, node, op, self._pending_alloc, self._pending_free,
                                 workspace))
        self._pending_alloc, self._pending_free = [], []


# ---- sizes and aliasing -----------------------------------------------------------------------

# Whether a node's value is a buffer of its own (False: fused into its readers), per phase.
Materialized = Callable[[str, fx.Node], bool]


# Per node: its tensor outputs' (index, storage key, hinted bytes, bytes expression), or None
# for a node without a value. Kept across the simulations of one joint's cuts (simulate_plan
# runs the joint's own nodes).
_Leaves = tuple[tuple[int, int | None, int, Any], ...]
LeafFacts = dict[fx.Node, _Leaves | None]
_UNKNOWN: Any = object()


def _leaf_facts(node: fx.Node) -> _Leaves | None:
    if "val" not in node.meta or has_no_result(node):
        return None
    val = node.meta["val"]
    return tuple((index, storage_key(t), storage_nbytes(t), storage_nbytes_expr(t))
                 for index, t in enumerate(val if isinstance(val, (list, tuple)) else (val,))
                 if isinstance(t, torch.Tensor))


def _define(mem: _Memory, node: fx.Node, env: dict[fx.Node, _Value],
            fused: bool = False, facts: LeafFacts | None = None) -> _Value:
    """The value ``node`` produces: aliases of its inputs' buffers, or new buffers. ``fused``:
    computed inside its readers' kernels, it holds its inputs' buffers until they have run.
    ``facts``: a memo of the nodes' output sizes, by node."""
    if facts is None:
        leaves = _leaf_facts(node)
    else:
        leaves = facts.get(node, _UNKNOWN)
        if leaves is _UNKNOWN:
            leaves = facts[node] = _leaf_facts(node)
    if leaves is None:
        return []
    val = node.meta["val"]
    inputs = node._input_nodes
    if fused and isinstance(val, torch.Tensor):
        held: dict[int, tuple[int | None, _Buffer]] = {}
        for arg in inputs:
            for key, buf in env.get(arg, ()):
                held.setdefault(buf.id, (key, buf))
        return list(held.values())
    target = node.target
    if target is operator.getitem:
        source = node.args[0] if node.args else None
        if (isinstance(source, fx.Node) and source in env
                and isinstance(source.meta.get("val"), (list, tuple))):
            return _getitem_value(node, env)
    elif target is offload_to_host:  # the host copy: no device bytes
        return [(storage_key(val), mem.new(node.name, 0, "computed"))]
    by_key = {key: buf for arg in inputs for key, buf in env.get(arg, ()) if key is not None}
    value: _Value = []
    for index, key, nbytes, expr in leaves:
        if key is not None and key in by_key:
            value.append((key, by_key[key]))
            continue
        base = schema_alias_arg(node, index) if key is None else None
        if base is not None and env.get(base):
            value.append((key, env[base][0][1]))
            continue
        value.append((key, mem.new(node.name, nbytes, "computed", expr)))
    return value


def _getitem_value(node: fx.Node, env: dict[fx.Node, _Value]) -> _Value:
    """``tuple[i]``: the i-th tensor of the tuple (None and scalar items hold no buffer)."""
    source, index = node.args[0], node.args[1]
    assert isinstance(source, fx.Node)
    items = value_leaves(source.meta.get("val"))
    if not isinstance(index, int) or not isinstance(items[index], torch.Tensor):
        return []
    position = sum(isinstance(t, torch.Tensor) for t in items[:index])
    held = env[source]
    return [held[position]] if position < len(held) else []


def _input_value(mem: _Memory, node: fx.Node, origin: str,
                 known: dict[int, _Buffer]) -> _Value:
    """Buffers of a placeholder that arrives from outside (aliased inputs share one)."""
    value: _Value = []
    for t in value_leaves(node.meta.get("val")):
        if not isinstance(t, torch.Tensor):
            continue
        key = storage_key(t)
        if key is not None and key in known:
            value.append((key, known[key]))
            continue
        buf = mem.new(node.name, storage_nbytes(t), origin, storage_nbytes_expr(t))
        if key is not None:
            known[key] = buf
        value.append((key, buf))
    return value


# ---- running a graph --------------------------------------------------------------------------

def _graph_of(g: GraphLike) -> fx.Graph:
    return g.graph if isinstance(g, fx.GraphModule) else g


def _op_name(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)) if node.op != "output" else "output"


@dataclass(frozen=True)
class _Program:
    """One graph as the simulation runs it: its inputs, its computed nodes in run order, and
    what it returns. Built from an fx graph, or from a cut's plan of joint nodes (the
    nodes extraction would copy, in the order the copies would have: ``simulate_plan``)."""

    placeholders: list[fx.Node]
    nodes: list[fx.Node]
    outputs: list[Any]  # the output node's arguments, flattened (nodes or constants)


def _program(graph: fx.Graph) -> _Program:
    placeholders: list[fx.Node] = []
    nodes: list[fx.Node] = []
    output: fx.Node | None = None
    for node in graph.nodes:
        if node.op == "placeholder":
            placeholders.append(node)
        elif node.op == "output":
            output = node if output is None else output
        else:
            nodes.append(node)
    if output is None:
        raise ValueError("the graph has no output node")
    return _Program(placeholders, nodes, pytree.arg_tree_leaves(*output.args))


def _as_program(graph: fx.Graph | _Program) -> _Program:
    return graph if isinstance(graph, _Program) else _program(graph)


def _output_args(graph: fx.Graph) -> list[Any]:
    output = next(iter(graph.find_nodes(op="output")))
    return pytree.arg_tree_leaves(*output.args)


def _deletions(program: _Program) -> dict[fx.Node, list[fx.Node]]:
    """Values fx code generation sets to None after each node (``delete_unused_values``):
    each value after its last reader; a value nothing reads right after it is made; the
    returned ones never."""
    seen: set[fx.Node] = {a for a in program.outputs if isinstance(a, fx.Node)}
    after: dict[fx.Node, list[fx.Node]] = {}
    for node in reversed(program.nodes):
        for arg in node._input_nodes:
            if arg not in seen:
                seen.add(arg)
                after.setdefault(node, []).append(arg)
    for node in program.nodes:
        if node not in seen:
            after.setdefault(node, []).append(node)  # unused results die at once
    return after


_TRANSFER_ROLES = {"copy_out": "to_host", "prefetch": "to_device"}


def _record_transfer(mem: _Memory, node: fx.Node) -> None:
    facts = node.meta.get(OFFLOAD_META)
    if node.op != "call_function" or not facts or facts["role"] not in _TRANSFER_ROLES:
        return
    mem.transfers.append(Transfer(facts["value"], _TRANSFER_ROLES[facts["role"]], node.name,
                                  facts["nbytes"], facts["seconds"], facts["hidden_seconds"]))


def _run_graph(mem: _Memory, program: _Program, phase: str, inputs: Sequence[_Value],
               workspace: WorkspaceFn | None = None,
               materialized: Materialized | None = None,
               facts: LeafFacts | None = None) -> list[_Value]:
    """Run ``program``'s nodes on ``inputs`` (the caller's references move into the graph's
    variables); return the output values, each held once for the caller. ``materialized``:
    which call nodes get a buffer of their own (default: all); graph outputs always do.
    ``facts``: see ``_define``."""
    env: dict[fx.Node, _Value] = dict(zip(program.placeholders, inputs))
    deletions = _deletions(program)
    returned = {a for a in program.outputs if isinstance(a, fx.Node)}
    nothing: list[Any] = []
    drop = mem.drop
    for node in program.nodes:
        is_call = node.op == "call_function"
        fused = (materialized is not None and is_call and node not in returned
                 and not materialized(phase, node))
        value = _define(mem, node, env, fused, facts)
        if OFFLOAD_META in node.meta:
            _record_transfer(mem, node)
        env[node] = value
        for _, buf in value:  # mem.hold
            buf.refs += 1
        for dead in deletions.get(node, nothing):
            drop(env.pop(dead, nothing))
        extra = workspace(node) if workspace is not None and is_call else 0
        mem.step(phase, node.name, _op_name(node), extra)
    outputs = [list(env.get(a, [])) if isinstance(a, fx.Node) else [] for a in program.outputs]
    for value in outputs:
        mem.hold(value)
    for value in env.values():  # the frame ends: unused placeholders and returned values
        mem.drop(value)
    mem.step(phase, "output", "output")
    return outputs


# ---- the step ---------------------------------------------------------------------------------

def _static_indices(num_placeholders: int, num_static_inputs: int | None,
                    static_input_indices: Iterable[int] | None) -> set[int]:
    if num_static_inputs is not None and static_input_indices is not None:
        raise ValueError("pass num_static_inputs or static_input_indices, not both")
    if static_input_indices is not None:
        return {i % num_placeholders for i in static_input_indices} if num_placeholders else set()
    return set(range(min(num_static_inputs or 0, num_placeholders)))


def _is_sym(val: Any) -> bool:
    return isinstance(val, py_sym_types) or isinstance(val, (int, float, bool))


@dataclass(frozen=True)
class _Layout:
    """How forward outputs map to backward inputs (AOTAutograd's convention)."""

    num_user_outputs: int
    num_saved_tensors: int
    num_saved_syms: int

    def backward_saved_order(self, fw_outputs: Sequence[Any]) -> list[Any]:
        """Forward saved outputs reordered as the backward takes them: symbols first."""
        start = self.num_user_outputs
        tensors = list(fw_outputs[start:start + self.num_saved_tensors])
        return list(fw_outputs[start + self.num_saved_tensors:]) + tensors


def _saved_placeholders(bw: _Program) -> list[fx.Node]:
    return [n for n in bw.placeholders
            if not (is_tangent(n) or is_bwd_seed_offset(n) or is_backward_state(n))]


def _layout(fw: fx.Graph | _Program, bw: fx.Graph | _Program) -> _Layout:
    fw, bw = _as_program(fw), _as_program(bw)
    saved = _saved_placeholders(bw)
    num_syms = sum(_is_sym(n.meta.get("val")) for n in saved)
    num_outputs = len(fw.outputs)
    if len(saved) > num_outputs:
        raise ValueError(f"the backward takes {len(saved)} saved values but the forward returns "
                         f"only {num_outputs} outputs: not a matching forward/backward pair")
    return _Layout(num_outputs - len(saved), len(saved) - num_syms, num_syms)


def simulate_partition(
    fw_graph: GraphLike,
    bw_graph: GraphLike,
    *,
    num_static_inputs: int | None = None,
    static_input_indices: Iterable[int] | None = None,
    hold_outputs: bool = True,
    alignment: int = 1,
    workspace: WorkspaceFn | str | None = None,
    materialized: Materialized | None = None,
    allocator: str | None = None,
    record_steps: bool = True,
) -> MemoryTimeline:
    """Simulate one training step's memory: the forward, then the backward.

    ``num_static_inputs`` (the first forward placeholders: parameters and buffers, as
    ``aot_module`` orders them) or ``static_input_indices`` (AOTAutograd's
    ``static_lifetime_input_indices``) say which inputs are "parameter"; both only label
    buffers, every forward input is held by the caller to the end. ``hold_outputs=False``
    drops the user outputs when the forward returns (a caller that only keeps the loss
    graph). ``alignment``: allocation granularity. ``allocator="cuda"``: count the blocks the
    CUDA caching allocator hands out (512-byte rounding, and cached blocks handed out whole
    when too little would remain to split), as ``max_memory_allocated`` does, in a training
    loop's steady state. ``workspace``: bytes each op allocates and frees inside its kernel (oneDNN convolutions
    on CPU), added to that step's high-water mark; ``"profile"`` measures each distinct op
    once (``profiled_workspace``), a callable ``node -> bytes`` supplies them, None ignores
    them (a pure fx-level model). ``materialized(phase, node)``: whether a call node gets a
    buffer of its own (False: fused into its readers, holding its inputs until they have
    run; graph outputs always do); None: every node does, as the graphs run eagerly.
    ``record_steps=False``: the peak only (a search pricing many cuts): the timeline's
    ``steps`` and ``live_at_peak`` are empty, every other field is as with steps recorded."""
    ws = profiled_workspace if workspace == "profile" else workspace
    if isinstance(ws, str):
        raise ValueError(f"workspace must be None, 'profile' or a callable, got {workspace!r}")
    return _simulate(_program(_graph_of(fw_graph)), _program(_graph_of(bw_graph)),
                     num_static_inputs=num_static_inputs,
                     static_input_indices=static_input_indices, hold_outputs=hold_outputs,
                     alignment=alignment, workspace=ws, materialized=materialized,
                     allocator=allocator, record_steps=record_steps)


def simulate_plan(
    joint_graph: fx.Graph,
    plan: CutPlan,
    *,
    static_input_indices: Iterable[int] | None = None,
    alignment: int = 1,
    workspace: WorkspaceFn | None = None,
    allocator: str | None = None,
    record_steps: bool = True,
    facts: LeafFacts | None = None,
) -> MemoryTimeline | None:
    """``simulate_partition`` of the cut ``plan`` describes (extract.plan_cut) as the
    partition's passes leave it (caps.finish_cut), without copying a node: the graphs are
    the plan's joint nodes in the order the copies would have, the backward reordered like
    ``reorder_backward``. None when the passes would change more than the order: a random
    op both graphs run (its RNG state is threaded through, passes/rng.py). ``facts``: a memo
    of the joint nodes' output sizes kept across the cuts of one joint (start with {})."""
    fw_nodes = plan.fw_nodes(joint_graph)
    bw_nodes = plan.bw_nodes(joint_graph)
    forward = set(fw_nodes)
    if any(n in forward and is_random(n) for n in bw_nodes):
        return None
    bw_inputs = list(plan.bw_inputs)
    inputs = set(bw_inputs)
    output = _PlanOutput(plan.bw_outputs)
    order = _backward_order([*bw_inputs, *bw_nodes, cast(fx.Node, output)],
                            is_input=inputs.__contains__)
    if order is not None:
        bw_nodes = [n for n in order[len(bw_inputs):] if n is not output]
    return _simulate(_Program(list(plan.fw_inputs), fw_nodes, list(plan.fw_outputs)),
                     _Program(bw_inputs, bw_nodes, list(plan.bw_outputs)),
                     num_static_inputs=None, static_input_indices=static_input_indices,
                     hold_outputs=True, alignment=alignment, workspace=workspace,
                     materialized=None, allocator=allocator, record_steps=record_steps,
                     facts=facts)


class _PlanOutput:
    """The backward's output node, as ``_backward_order`` reads one: the values it returns."""

    op = "output"
    target = "output"
    users: dict[fx.Node, None] = {}

    def __init__(self, outputs: Sequence[Any]) -> None:
        self._input_nodes = dict.fromkeys(a for a in outputs if isinstance(a, fx.Node))


def _simulate(fw: _Program, bw: _Program, *, num_static_inputs: int | None,
              static_input_indices: Iterable[int] | None, hold_outputs: bool, alignment: int,
              workspace: WorkspaceFn | None, materialized: Materialized | None,
              allocator: str | None, record_steps: bool,
              facts: LeafFacts | None = None) -> MemoryTimeline:
    ws = workspace
    layout = _layout(fw, bw)
    mem = _Memory(alignment, allocator)
    fw_values = _forward_inputs(mem, fw, num_static_inputs, static_input_indices)
    for value in fw_values:
        mem.hold(value)  # the caller's reference, kept to the end of the step
    fw_in = [list(v) for v in fw_values]
    for value in fw_in:
        mem.hold(value)  # the forward's own variables
    fw_out = _run_graph(mem, fw, "forward", fw_in, ws, materialized, facts)
    saved_in_fw_order = fw_out[layout.num_user_outputs:]
    _mark(fw_out[:layout.num_user_outputs], "output")
    _mark(saved_in_fw_order, "saved")
    # The one measure (sizes.saved_bytes), not the aligned buffers: every report agrees.
    saved = saved_bytes(a for a in fw.outputs[layout.num_user_outputs:]
                        if isinstance(a, fx.Node))
    if not hold_outputs:
        for value in fw_out[:layout.num_user_outputs]:
            mem.drop(value)
    bw_in = _backward_inputs(mem, bw, layout.backward_saved_order(fw_out))
    grads = _run_graph(mem, bw, "backward", bw_in, ws, materialized, facts)
    _mark(grads, "gradient")
    if not record_steps:
        return _peak_summary(mem, fw_values, saved)
    return _timeline(mem, fw_values, saved)


def _forward_inputs(mem: _Memory, fw: fx.Graph | _Program, num_static_inputs: int | None,
                    static_input_indices: Iterable[int] | None) -> list[_Value]:
    placeholders = _as_program(fw).placeholders
    static = _static_indices(len(placeholders), num_static_inputs, static_input_indices)
    known: dict[int, _Buffer] = {}
    return [_input_value(mem, n, "parameter" if i in static else "input", known)
            for i, n in enumerate(placeholders)]


def _backward_inputs(mem: _Memory, bw: fx.Graph | _Program, saved: list[_Value]
                     ) -> list[_Value]:
    """Saved values (their references move in), then tangents and seeds, allocated now."""
    placeholders = _as_program(bw).placeholders
    values = list(saved)
    known: dict[int, _Buffer] = {}
    for node in placeholders[len(saved):]:
        value = _input_value(mem, node, "tangent", known)
        mem.hold(value)
        values.append(value)
    mem.step("backward", "tangents", "inputs")
    return values


def _mark(values: Iterable[_Value], role: str) -> None:
    for value in values:
        for _, buf in value:
            buf.roles.add(role)


def _timeline(mem: _Memory, fw_values: list[_Value], saved_bytes: int) -> MemoryTimeline:
    """Replay the recorded steps with the buffers' final kinds."""
    inputs = {buf.id: buf for value in fw_values for _, buf in value}
    by_kind = dict.fromkeys(KINDS, 0)
    for buf in inputs.values():
        by_kind[buf.kind()] += buf.nbytes
    baseline = sum(b.nbytes for b in inputs.values())
    blocks = _allocator_marks(mem, inputs) if mem.allocator == "cuda" else None
    total, peak, peak_step = baseline, baseline, 0
    steps: list[MemoryStep] = []
    for index, raw in enumerate(mem.raw):
        allocated = sum(b.nbytes for b in raw.allocated)
        for buf in raw.allocated:
            by_kind[buf.kind()] += buf.nbytes
        high = total + allocated + raw.workspace
        freed = sum(b.nbytes for b in raw.freed)
        for buf in raw.freed:
            by_kind[buf.kind()] -= buf.nbytes
        total = high - raw.workspace - freed
        if blocks is not None:  # the blocks the allocator hands out, not the buffers' bytes
            high, total = baseline + blocks[index][0], baseline + blocks[index][1]
        if high > peak:
            peak, peak_step = high, index
        high_kinds = {k: v for k, v in by_kind.items() if v}
        if raw.workspace:
            high_kinds["workspace"] = raw.workspace
        steps.append(MemoryStep(raw.phase, raw.node, raw.op, allocated, freed, high, total,
                                high_kinds))
    from .symbolic_peak import peak_expressions

    return MemoryTimeline(
        steps=steps, peak_bytes=peak, peak_step=peak_step,
        live_at_peak=_live_at(mem, inputs, peak_step), baseline_bytes=baseline,
        parameter_bytes=sum(b.nbytes for b in inputs.values() if b.origin == "parameter"),
        saved_bytes=saved_bytes, end_bytes=total, transfers=list(mem.transfers),
        peak_expressions=peak_expressions(mem, list(inputs.values())))


def _peak_summary(mem: _Memory, fw_values: list[_Value], saved_bytes: int) -> MemoryTimeline:
    """``_timeline``'s peak, baseline and ends without its per-step records (the same walk:
    allocations, then the op's workspace, then the frees)."""
    inputs = {buf.id: buf for value in fw_values for _, buf in value}
    baseline = sum(b.nbytes for b in inputs.values())
    blocks = _allocator_marks(mem, inputs) if mem.allocator == "cuda" else None
    total, peak, peak_step = baseline, baseline, 0
    for index, raw in enumerate(mem.raw):
        if blocks is not None:
            high, total = baseline + blocks[index][0], baseline + blocks[index][1]
        else:
            allocated = sum(b.nbytes for b in raw.allocated) if raw.allocated else 0
            high = total + allocated + raw.workspace
            total = high - raw.workspace - (sum(b.nbytes for b in raw.freed)
                                            if raw.freed else 0)
        if high > peak:
            peak, peak_step = high, index
    from .symbolic_peak import peak_expressions

    return MemoryTimeline(
        steps=[], peak_bytes=peak, peak_step=peak_step, live_at_peak=[],
        baseline_bytes=baseline,
        parameter_bytes=sum(b.nbytes for b in inputs.values() if b.origin == "parameter"),
        saved_bytes=saved_bytes, end_bytes=total, transfers=list(mem.transfers),
        peak_expressions=peak_expressions(mem, list(inputs.values())))


def _allocator_marks(mem: _Memory, inputs: dict[int, _Buffer]) -> list[tuple[int, int]]:
    """Each step's high and after-free bytes above the inputs, as the CUDA caching allocator
    counts them in a loop's steady state (caching_allocator.replay)."""
    from .caching_allocator import StepEvents, replay

    return replay([StepEvents(tuple((b.id, b.nbytes) for b in raw.allocated), raw.workspace,
                              tuple(b.id for b in raw.freed if b.id not in inputs))
                   for raw in mem.raw])


def _live_at(mem: _Memory, inputs: dict[int, _Buffer], index: int) -> list[LiveBuffer]:
    """The buffers live at step ``index``'s high-water mark (before its frees)."""
    live = dict(inputs)
    for raw in mem.raw[:index]:
        live.update((b.id, b) for b in raw.allocated)
        for buf in raw.freed:
            live.pop(buf.id, None)
    out = [LiveBuffer(b.name, b.nbytes, b.kind()) for b in live.values()]
    if mem.raw:
        raw = mem.raw[index]
        out += [LiveBuffer(b.name, b.nbytes, b.kind()) for b in raw.allocated]
        if raw.workspace:
            out.append(LiveBuffer(raw.node, raw.workspace, "workspace"))
    return out


def simulate_joint(
    joint_module: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    saved_values: list[fx.Node] | None = None,
    saved_sym_nodes: list[fx.Node] | None = None,
    num_static_inputs: int | None = None,
    static_input_indices: Iterable[int] | None = None,
    **options: Any,
) -> MemoryTimeline:
    """Cut ``joint_module`` at ``saved_values`` (default: the default partition's, every
    forward value the backward reads) and simulate the step; ``options`` go to
    ``simulate_partition``. The joint is not modified."""
    from ..fx.extract import default_saved_values, extract_forward_backward_graphs

    if saved_values is None:
        saved_values, default_syms = default_saved_values(joint_module, num_fwd_outputs)
        saved_sym_nodes = default_syms if saved_sym_nodes is None else saved_sym_nodes
    fw, bw, _, _ = extract_forward_backward_graphs(
        joint_module, list(saved_values), list(saved_sym_nodes or []),
        num_fwd_outputs=num_fwd_outputs)
    return simulate_partition(fw, bw, num_static_inputs=num_static_inputs,
                              static_input_indices=static_input_indices, **options)


# ---- measuring a real run ---------------------------------------------------------------------

@dataclass(frozen=True)
class MeasuredMemory:
    """What the allocator saw in one real step, relative to what was allocated before it."""

    peak_bytes: int
    end_bytes: int
    device: str
    method: str  # "profiler" (CPU allocation events) or "cuda" (max_memory_allocated)
    # CUDA: the peak of the bytes requested (before the caching allocator's blocks)
    requested_peak_bytes: int | None = None


def _hinted(shape: Iterable[Any]) -> list[int]:
    return [size_hint(s) for s in shape]


def example_value(val: Any, device: torch.device | str) -> Any:
    """A real tensor shaped like the fake ``val`` (same strides, so the same storage bytes):
    random floats, zero integers (valid indices); symbolic scalars become their hints."""
    if isinstance(val, torch.SymInt):
        return size_hint(val)
    if isinstance(val, (torch.SymFloat, torch.SymBool)):
        return type(val.node.hint)(val.node.hint) if val.node.hint is not None else 1
    if not isinstance(val, torch.Tensor):
        return val
    t = torch.empty_strided(_hinted(val.shape), _hinted(val.stride()), dtype=val.dtype,
                            device=device)
    return t.normal_() if t.is_floating_point() else t.zero_()


def _boxed_module(module: GraphLike) -> tuple[Callable[[list[Any]], Any], bool]:
    """A callable taking one list and clearing it (as AOTAutograd calls a compiled
    backward), so arguments die after their last use; plain call where fx lacks it."""
    gm = module if isinstance(module, fx.GraphModule) else fx.GraphModule(torch.nn.Module(),
                                                                           module)
    try:
        from torch.fx.graph import _BoxedCodeGen
    except ImportError:  # pragma: no cover - every supported release has it
        log.warning("torch.fx has no _BoxedCodeGen: backward inputs stay alive while it runs")
        return (lambda args: gm(*args)), False
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph.set_codegen(_BoxedCodeGen())
    return fx.GraphModule(gm, graph), True


def _as_module(g: GraphLike) -> fx.GraphModule:
    return g if isinstance(g, fx.GraphModule) else fx.GraphModule(torch.nn.Module(), g)


def measure_partition(
    fw_module: GraphLike,
    bw_module: GraphLike,
    fw_inputs: Sequence[Any] | None = None,
    *,
    device: str | torch.device = "cpu",
    hold_outputs: bool = True,
    warmup: bool = True,
) -> MeasuredMemory:
    """Run the forward then the backward (boxed: inputs freed after their last use) under
    ``torch.no_grad`` and return the allocator's peak above the memory allocated before.

    ``fw_inputs`` defaults to random tensors shaped like the forward's placeholders; tangents
    are always made from the backward's placeholders. On CPU the peak is rebuilt from the
    profiler's allocation events (``profile_memory=True``); on CUDA it is
    ``max_memory_allocated`` after ``reset_peak_memory_stats``. ``warmup`` runs the step once
    first, so one-time allocations (library workspaces) are not counted."""
    fw, bw = _as_module(fw_module), _as_module(bw_module)
    dev = torch.device(device)
    if fw_inputs is None:
        fw_inputs = [example_value(n.meta.get("val"), dev)
                     for n in fw.graph.find_nodes(op="placeholder")]
    boxed_bw, _ = _boxed_module(bw)
    layout = _layout(fw.graph, bw.graph)
    tangent_vals = [n.meta.get("val") for n in list(bw.graph.find_nodes(op="placeholder"))[
        layout.num_saved_tensors + layout.num_saved_syms:]]

    def step() -> tuple[list[Any], Any]:
        return _run_step(fw, boxed_bw, list(fw_inputs), layout, tangent_vals, dev, hold_outputs)

    if warmup:
        with torch.no_grad():
            step()
    gc.collect()
    if dev.type == "cuda":
        return _measure_cuda(step, dev)
    return _measure_cpu_profiler(step, str(dev))


def _run_step(fw: fx.GraphModule, boxed_bw: Callable[[list[Any]], Any], fw_inputs: list[Any],
              layout: _Layout, tangent_vals: list[Any], device: torch.device,
              hold_outputs: bool) -> tuple[list[Any], Any]:
    """One forward + backward; returns what the caller keeps (user outputs, gradients)."""
    outs = list(fw(*fw_inputs))
    user = outs[:layout.num_user_outputs]
    args = layout.backward_saved_order(outs)
    del outs
    if not hold_outputs:
        user = []
    args += [example_value(v, device) for v in tangent_vals]
    grads = boxed_bw(args)
    return user, grads


def measure_peak(step: Callable[[], Any], device: str | torch.device = "cpu", *,
                 grad: bool = True) -> MeasuredMemory:
    """Run ``step()`` once and return the allocator's peak above the memory allocated before
    it (and what is still allocated after it, while its result is held): on CPU rebuilt from
    the profiler's allocation events, on CUDA ``max_memory_allocated`` after
    ``reset_peak_memory_stats``. ``grad``: run with autograd on (a training step whose loss
    and backward are inside ``step``), else under ``torch.no_grad``."""
    dev = torch.device(device)
    gc.collect()
    if dev.type == "cuda":
        return _measure_cuda(step, dev, grad=grad)
    return _measure_cpu_profiler(step, str(dev), grad=grad)


def _measure_cpu_profiler(step: Callable[[], Any], device: str, *,
                          grad: bool = False) -> MeasuredMemory:
    peak, end = profiled_cpu_peak(step, grad=grad)
    return MeasuredMemory(peak, end, device, "profiler")


def _measure_cuda(step: Callable[[], Any], device: torch.device, *,
                  grad: bool = False) -> MeasuredMemory:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    requested_before = torch.cuda.memory_stats(device).get("requested_bytes.all.current")
    with torch.set_grad_enabled(grad):
        kept = step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    end = torch.cuda.memory_allocated(device) - before
    requested_peak = torch.cuda.memory_stats(device).get("requested_bytes.all.peak")
    del kept
    requested = (None if requested_before is None or requested_peak is None
                 else requested_peak - requested_before)
    return MeasuredMemory(peak, end, str(device), "cuda", requested)



# ---- op workspaces ----------------------------------------------------------------------------

_workspace_cache: dict[Any, int] = {}


# Our chunked ops are run to measure their scratch only below this estimate (bytes) and this
# many FLOPs (a few tenths of a second on a CPU core; at Llama-3-8B sizes a run took 40 s).
_MEASURED_WORKSPACE_LIMIT = 256 * 2**20
_MEASURED_WORKSPACE_FLOPS_LIMIT = 5e9


def profiled_workspace(node: fx.Node,
                       strides: dict[fx.Node, tuple[int, ...]] | None = None) -> int:
    """Bytes ``node``'s op allocates and frees inside its kernel, beyond its outputs: its peak
    allocation while running minus what it leaves allocated. Measured once per op and argument
    signature (shapes, strides, dtypes) by running it on random tensors; 0 for views and for
    anything that cannot run (an op with data-dependent requirements). ``strides``: the
    layout an argument really arrives with, where it is not its value's (a compiler's
    channels-last convolution input: oneDNN reorders what is not)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or any(
            r.alias_info is not None for r in target._schema.returns):
        return 0
    from ..split import chunked_loss, chunked_mlp

    if target in chunked_loss.CHUNKED_OPS or target in chunked_mlp.CHUNKED_OPS:
        # Ours: measured like any op where that is cheap (a library's scratch, e.g. oneDNN's
        # for a bf16 matmul, shows only there), else from the shapes, at any size.
        args = pytree.tree_map_only(fx.Node, lambda a: a.meta.get("val"), node.args)
        ours = chunked_loss if target in chunked_loss.CHUNKED_OPS else chunked_mlp
        estimate = ours.workspace_bytes(target, tuple(args))
        fake = any(isinstance(v, torch.Tensor) and v.device.type == "meta"
                   for v in pytree.tree_leaves(args))
        # (a compiled chunk body is not compiled inside a compile: its scratch from the shapes)
        compiled = ours is chunked_loss and chunked_loss.compiled_body_planned(target, tuple(args))
        if fake or compiled or estimate > _MEASURED_WORKSPACE_LIMIT \
                or _op_flops(target, args) > _MEASURED_WORKSPACE_FLOPS_LIMIT:
            return estimate
    strides = strides or {}
    key = (target, _signature((node.args, node.kwargs)),
           tuple(sorted((a.name, s) for a, s in strides.items())))
    if key not in _workspace_cache:
        try:
            _workspace_cache[key] = _measure_workspace(node, strides)
        except Exception as exc:  # e.g. an op that rejects random arguments
            log.debug("workspace of %s not measurable: %s", node.name, exc)
            _workspace_cache[key] = 0
    return _workspace_cache[key]


def _op_flops(target: Any, args: Any) -> float:
    """The FLOPs the op's registered formula counts (``inf`` when it has none)."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(target.overloadpacket)
    if formula is None:
        return math.inf
    return float(formula(*args, out_val=None))


@functools.cache
def _split_ops() -> frozenset[Any]:
    # Imported on first use (the chunked ops register torch ops), then a set lookup per node.
    from ..split import chunked_loss, chunked_mlp

    return frozenset((*chunked_loss.CHUNKED_OPS, *chunked_mlp.CHUNKED_OPS))


def split_op_workspace(node: fx.Node) -> int:
    """``profiled_workspace`` for the split's chunked ops (their scratch, one chunk's logits or
    intermediates, is what they exist to bound), 0 for every other op: the eager model's
    workspace, which leaves the library ops of a pure fx-level model out."""
    if node.target in _split_ops():
        return profiled_workspace(node)
    return 0


def clear_workspace_cache() -> None:
    """Forget every measured workspace (e.g. after switching devices or libraries)."""
    _workspace_cache.clear()


def _measure_workspace(node: fx.Node, strides: dict[fx.Node, tuple[int, ...]]) -> int:
    vals = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
    on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in pytree.tree_leaves(vals))
    device = torch.device("cuda") if on_cuda else torch.device("cpu")
    op = cast(Callable[..., Any], node.target)

    # real_kernels: called inside torch.compile, tensors made here would be fake.
    # fork_rng: a random op must not shift the user's generator.
    with real_kernels(), torch.no_grad(), torch.random.fork_rng(
            devices=[torch.cuda.current_device()] if on_cuda else []):
        def value(a: fx.Node) -> Any:
            made = example_value(a.meta.get("val"), device)
            if a in strides and isinstance(made, torch.Tensor):
                made = torch.empty_strided(made.shape, strides[a], dtype=made.dtype,
                                           device=device).copy_(made)
            return made

        args, kwargs = pytree.tree_map_only(fx.Node, value, (node.args, node.kwargs))
        check_real_tensors((args, kwargs), f"measuring the workspace of {node.name}")

        def run() -> Any:
            return op(*args, **kwargs)

        run()  # warm-up: one-time allocations are not a workspace
        measured = _measure_cuda(run, device) if on_cuda else _measure_cpu_profiler(run, "cpu")
    return max(0, measured.peak_bytes - measured.end_bytes)
