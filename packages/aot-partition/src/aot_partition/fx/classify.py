"""Classify joint-graph nodes: required forward/backward, unclaimed, inputs, order, distances.

Also the operator categories (fusible, compute-intensive, random, view, recomputable) with
their default lists. Everything here is computed once per partition and then only read; the
joint graph's conventions (which placeholder is what, outputs, order) are in ``joint.py``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.sym_node import magic_methods, method_to_operator

from ..split import chunked_loss, chunked_mlp
from .joint import (
    ancestors_within,
    aten_packet,
    computable_from,
    forward_and_backward_outputs,
    is_fwd_seed_offset,
    is_primal,
    is_tangent,
)

aten = torch.ops.aten
prims = torch.ops.prims

# Distance given to nodes that never reach the backward (and to the output node).
FAR_FROM_BACKWARD = int(1e9)


# ---- operator categories ---------------------------------------------------------------------

_FUSIBLE, _COMPUTE_INTENSIVE, _RANDOM, _VIEW, _RECOMPUTABLE = 1, 2, 4, 8, 16


@dataclass(frozen=True)
class OpTypes:
    """Operator categories, as sets of OpOverloadPackets (or plain callables)."""

    fusible_ops: frozenset[Callable[..., Any]]
    compute_intensive_ops: frozenset[Callable[..., Any]]
    random_ops: frozenset[Callable[..., Any]]
    view_ops: frozenset[Callable[..., Any]]
    recomputable_ops: frozenset[Callable[..., Any]]
    # Also count every aten packet with an overload tagged pointwise as recomputable and
    # fusible, checked per packet the first time a graph uses it: listing them all up front
    # (1,300 packets, as torch's ``get_default_op_list`` does) cost more than a whole
    # partition of a small graph.
    pointwise_recomputable: bool = False
    # target -> its categories as bits: the policy asks tens of thousands of times per
    # partition, and an OpOverloadPacket hashes in Python.
    _memo: dict[Any, int] = field(default_factory=dict, init=False, compare=False, repr=False)

    def _categories(self, node: fx.Node) -> int:
        target = node.target
        try:
            return self._memo[target]
        except KeyError:
            bits = self._memo[target] = self._categories_of(aten_packet(node))
            return bits
        except TypeError:  # an unhashable target
            return self._categories_of(aten_packet(node))

    def _categories_of(self, packet: Any) -> int:
        pointwise = self.pointwise_recomputable and is_pointwise(packet)
        return ((pointwise or packet in self.fusible_ops) * _FUSIBLE
                | (packet in self.compute_intensive_ops) * _COMPUTE_INTENSIVE
                | (packet in self.random_ops) * _RANDOM
                | (packet in self.view_ops) * _VIEW
                | (pointwise or packet in self.recomputable_ops) * _RECOMPUTABLE)

    def recomputes(self, packet: Any) -> bool:
        """Whether ops of ``packet`` (an OpOverloadPacket or a plain callable) may be
        recomputed: in ``recomputable_ops``, or pointwise under ``pointwise_recomputable``."""
        return bool(self._categories_of(packet) & _RECOMPUTABLE)

    def is_fusible(self, node: fx.Node) -> bool:
        return bool(self._categories(node) & _FUSIBLE)

    def is_compute_intensive(self, node: fx.Node) -> bool:
        return bool(self._categories(node) & _COMPUTE_INTENSIVE)

    def is_random(self, node: fx.Node) -> bool:
        return bool(self._categories(node) & _RANDOM)

    def is_view(self, node: fx.Node) -> bool:
        return bool(self._categories(node) & _VIEW)

    def is_recomputable(self, node: fx.Node) -> bool:
        return bool(self._categories(node) & _RECOMPUTABLE)


def _existing(namespace: Any, names: Iterable[str]) -> list[Any]:
    # Some prims exist only in some torch releases; skip the missing ones.
    return [getattr(namespace, n) for n in names if hasattr(namespace, n)]


def is_pointwise(packet: Any) -> bool:
    """An aten packet with at least one overload tagged pointwise (torch's own test)."""
    if not (isinstance(packet, torch._ops.OpOverloadPacket)
            and getattr(packet, "_qualified_op_name", "").startswith("aten::")):
        return False
    return any(torch.Tag.pointwise in overload.tags for overload in _overloads_of(packet))


def _overloads_of(packet: torch._ops.OpOverloadPacket) -> Iterable[Any]:
    # op_overloads() hands the overload objects over at once (about half the time of looking
    # each name up, on a cold process); older releases may lack it.
    op_overloads = getattr(packet, "op_overloads", None)
    if op_overloads is not None:
        return op_overloads()
    return (getattr(packet, name) for name in packet.overloads())


_RECOMPUTABLE_ATEN = (
    "add sub div atan2 mul max min pow remainder fmod __and__ __or__ __xor__ __lshift__ "
    "__rshift__ eq ne ge gt le lt abs bitwise_not ceil floor frac neg relu round silu trunc log "
    "log10 log1p log2 lgamma exp expm1 erf erfc cos acos cosh sin asin sinh tan atan tanh atanh "
    "sqrt rsqrt reciprocal sigmoid softplus threshold threshold_backward clamp where lerp "
    "addcmul gelu gelu_backward sum mean _grad_sum_to_size sum_to_size amax to type_as squeeze "
    "unsqueeze rsub _to_copy clone full_like var std select _unsafe_view view expand slice "
    "reshape broadcast_tensors scalar_tensor ones new_zeros lift_fresh_copy arange triu var_mean "
    "isinf any full as_strided zeros empty empty_like argmax maximum index gather zeros_like"
).split()
_RECOMPUTABLE_PRIMS = (
    "div convert_element_type prepare_softmax_online var sum broadcast_in_dim iota "
    "_low_memory_max_pool2d_offsets_to_indices _low_memory_max_pool_offsets_to_indices"
).split()
_VIEW_ATEN = "squeeze unsqueeze alias view slice t expand as_strided permute select split".split()
_RANDOM_ATEN = "native_dropout rand_like randn_like".split()
_COMPUTE_INTENSIVE_ATEN = (
    "mm convolution convolution_backward bmm addmm _scaled_dot_product_flash_attention "
    "_scaled_dot_product_efficient_attention _flash_attention_forward "
    "_efficient_attention_forward upsample_bilinear2d _scaled_mm"
).split()


@functools.lru_cache(None)
def default_op_types() -> OpTypes:
    """The default operator categories (torch's inductor lists, plus 2.13 additions)."""
    view_ops = _existing(aten, _VIEW_ATEN) + _existing(prims, ["broadcast_in_dim"])
    recomputable = (
        _existing(aten, _RECOMPUTABLE_ATEN)
        + _existing(prims, _RECOMPUTABLE_PRIMS)
        + [operator.getitem]
        + view_ops
        + [method_to_operator(m) for m in magic_methods]
    )  # + every aten pointwise packet, looked up per packet (pointwise_recomputable)
    random_ops = _existing(aten, _RANDOM_ATEN)
    return OpTypes(
        fusible_ops=frozenset(recomputable) | frozenset(random_ops),
        # The split's chunked ops run the LM head's or the MLP's matmuls: recomputing one
        # repeats them all, so they are banned like a matmul and released only by the
        # knapsack, at their price.
        compute_intensive_ops=frozenset(_existing(aten, _COMPUTE_INTENSIVE_ATEN))
        | frozenset(op.overloadpacket
                    for op in (*chunked_loss.CHUNKED_OPS, *chunked_mlp.CHUNKED_OPS)),
        random_ops=frozenset(random_ops),
        view_ops=frozenset(view_ops),
        recomputable_ops=frozenset(recomputable),
        pointwise_recomputable=True,
    )


# ---- node classification ---------------------------------------------------------------------

@dataclass
class NodeInfo:
    """Where each joint-graph node belongs. Sets are for membership; iterate the ordered lists."""

    inputs: list[fx.Node]                    # primals + forward seed/offset
    required_fw: set[fx.Node]                # needed to compute the forward outputs
    required_bw: set[fx.Node]                # depend on tangents, or are gradients
    tangents_closure: set[fx.Node]           # depend on tangents (must run in backward)
    unclaimed: set[fx.Node]                  # neither: free to go either way
    fw_order: dict[fx.Node, int]             # position among required_fw, in graph order
    dist_from_bw: dict[fx.Node, int]         # hops to the nearest non-forward user
    static_lifetime_inputs: set[fx.Node] = field(default_factory=set)
    bw_outputs: list[fx.Node] = field(default_factory=list)  # the gradients, in output order

    @functools.cached_property
    def required_fw_nodes(self) -> list[fx.Node]:
        return sorted(self.required_fw, key=self.fw_order.__getitem__)

    def is_required_fw(self, node: fx.Node) -> bool:
        return node in self.required_fw

    def get_fw_order(self, node: fx.Node) -> int:
        if node not in self.fw_order:
            raise KeyError(f"node '{node.name}' is not a required forward node")
        return self.fw_order[node]


def classify(
    joint_module: fx.GraphModule,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Iterable[int] | None = None,
) -> NodeInfo:
    """Classify every node of ``joint_module`` once (see NodeInfo)."""
    graph = joint_module.graph
    nodes = list(graph.nodes)
    # Only placeholders are primals, seeds or tangents: the other nodes skip those checks.
    placeholders = [n for n in nodes if n.op == "placeholder"]
    tangents = set(filter(is_tangent, placeholders))
    tangents_closure: set[fx.Node] = set()
    for node in nodes:
        if node in tangents or not tangents_closure.isdisjoint(node._input_nodes):
            if node.op != "output":
                tangents_closure.add(node)

    primals = [n for n in placeholders if is_primal(n)]
    inputs = primals + [n for n in placeholders if is_fwd_seed_offset(n)]
    fw_outputs, bw_outputs, _, _ = forward_and_backward_outputs(joint_module, num_fwd_outputs)
    required_bw = set(tangents_closure)
    required_bw.update(o for o in bw_outputs if isinstance(o, fx.Node) and o.op != "output")
    required_fw = ancestors_within(fw_outputs, computable_from(graph, inputs))
    # Forward-computable inputs count as required forward even when no output uses them.
    required_fw.update(inputs)
    unclaimed = {n for n in nodes if n not in required_fw and n not in required_bw}
    fw_order: dict[fx.Node, int] = {}
    for node in nodes:
        if node in required_fw:
            fw_order[node] = len(fw_order)
    static_indices = set(static_lifetime_input_indices or ())
    return NodeInfo(
        inputs=inputs,
        required_fw=required_fw,
        required_bw=required_bw,
        tangents_closure=tangents_closure,
        unclaimed=unclaimed,
        fw_order=fw_order,
        dist_from_bw=distances_from_backward(nodes, required_fw),
        static_lifetime_inputs={p for i, p in enumerate(primals) if i in static_indices},
        bw_outputs=[o for o in bw_outputs if isinstance(o, fx.Node)],
    )


def distances_from_backward(nodes: list[fx.Node], required_fw: set[fx.Node]) -> dict[fx.Node, int]:
    """Hops from each forward node to its nearest user outside the forward (0 outside it)."""
    dist: dict[fx.Node, int] = {}
    hops_of = dist.__getitem__
    for node in reversed(nodes):
        if node.op == "output":
            dist[node] = FAR_FROM_BACKWARD
        elif node not in required_fw:
            dist[node] = 0
        else:  # one more than its nearest user's; FAR_FROM_BACKWARD without users, and at most
            nearest = min(map(hops_of, node.users), default=FAR_FROM_BACKWARD - 1)
            dist[node] = min(nearest + 1, FAR_FROM_BACKWARD)
    return dist
