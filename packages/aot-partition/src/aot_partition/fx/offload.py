"""Offload saved activations to host memory: the third fate of a saved value.

Given the forward and backward graphs of a cut (extract.py) and the names of saved tensors
to offload, ``offload_saved_values`` rewrites both (the operators are in
passes/offload_ops.py):

- forward: right after the value is computed, ``offload_to_host`` starts its copy on a side
  stream; ``wait_offload`` (the value's last use, so it is freed right after) goes after its
  last forward use, sunk further until the compute since the copy started (roofline estimates)
  covers the transfer, at most to the forward's end. The host copy is returned in the value's
  saved slot.
- backward: the saved input is now the host copy. ``prefetch_to_device`` goes as late as the
  compute between it and the first use still covers the transfer (as early as possible when
  nothing does), ``wait_prefetch`` right before the first use, which then reads its result.

Which values may be offloaded (``offload_obstacle``): saved tensors of this cut that are
computed in the forward (not inputs: the caller holds those), not also user outputs, not
views (their base stays), dense and non-overlapping (strides are kept), on CUDA or CPU, and not tagged MUST_SAVE.
``choose_offloads`` merges torch's ``should_offload`` tags with the names a planner asked
for; an impossible tag is skipped with a note, an impossible requested name raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import is_sym_node
from torch.utils.checkpoint import CheckpointPolicy

from ..costs.estimators import estimate_runtime
from ..costs.roofline import device_numbers, moves_nothing
from .joint import is_backward_state, is_bwd_seed_offset, is_tangent
from .passes.offload_ops import (
    OFFLOAD_META,
    OFFLOAD_OPS,
    offload_to_host,
    prefetch_to_device,
    wait_offload,
    wait_prefetch,
)
from .sizes import is_opaque, node_nbytes, size_hint

log = logging.getLogger(__name__)

__all__ = ["OFFLOAD_META", "SHOULD_OFFLOAD", "OffloadedValue", "choose_offloads",
           "host_link_bandwidth", "offload_obstacle", "offload_saved_values"]

SHOULD_OFFLOAD = "should_offload"      # torch's tag (node.meta), honoured as a user request

# Device <-> host link, bytes/s, by roofline device-table name prefix: PCIe gen5 x16 for
# Hopper, gen4 for Ampere/Ada, gen3 before; about 80% of the link's peak, as measured copies
# reach. CPU "host" copies run at the CPU's memory bandwidth.
_HOST_LINK_GBPS = (("H200", 50.0), ("H100", 50.0), ("A100", 25.0), ("L40S", 25.0),
                   ("L4", 25.0), ("A10", 25.0), ("RTX 4090", 25.0), ("RTX 3090", 25.0),
                   ("V100", 12.0), ("T4", 12.0))
_DEFAULT_CUDA_LINK_GBPS = 12.0  # an unknown GPU: the slowest link in the table


@dataclass(frozen=True)
class OffloadedValue:
    """One offloaded value: its bytes, the window it is off the device, its transfers."""

    name: str
    nbytes: int
    reason: str                   # who asked: "should_offload tag", "planner", "requested"
    freed_after: str              # forward node after which the device copy is freed
    prefetched_before: str        # backward node before which the prefetch is issued
    first_use: str                # backward node that first reads it
    transfer_seconds: float       # one copy, one direction
    forward_hidden_seconds: float   # compute the copy-out overlaps (roofline)
    backward_hidden_seconds: float  # compute the prefetch overlaps (roofline)

    @property
    def exposed_seconds(self) -> float:
        """Transfer time no compute hides (both copies): the estimated slowdown."""
        return (max(0.0, self.transfer_seconds - self.forward_hidden_seconds)
                + max(0.0, self.transfer_seconds - self.backward_hidden_seconds))

    @property
    def window(self) -> str:
        return f"forward '{self.freed_after}' .. backward '{self.prefetched_before}'"

    def describe(self) -> str:
        return f"offloaded: {self.nbytes} bytes over {self.window} ({self.reason})"


def host_link_bandwidth(device: torch.device, gbps: float | None) -> float:
    """Bytes/s between ``device`` and host memory: ``gbps`` (the flag) if set, else the
    device table's link (H100: 50 GB/s), the CPU's memory bandwidth for a CPU value."""
    if gbps is not None:
        if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) \
                or not 0 < gbps < float("inf"):
            raise ValueError(f"activation_offload_cpu_gpu_bw must be a positive, finite number "
                             f"of GB/s, got {gbps!r}")
        return gbps * 1e9
    numbers = device_numbers(device)
    if device.type != "cuda":
        return numbers.bandwidth
    for prefix, link in _HOST_LINK_GBPS:
        if numbers.name.startswith(prefix):
            return link * 1e9
    return _DEFAULT_CUDA_LINK_GBPS * 1e9


# ---- which values ---------------------------------------------------------------------------

def _saved_layout(fw_graph: fx.Graph, bw_graph: fx.Graph, num_fwd_outputs: int
                  ) -> tuple[fx.Node, list[Any], range, dict[str, fx.Node]]:
    """(the forward's output node, its values, the saved tensors' slots in them, the
    backward's saved-tensor inputs by name); AOTAutograd's layout (extract.py)."""
    output = next(iter(fw_graph.find_nodes(op="output")))
    values = list(output.args[0])
    saved_inputs = [n for n in bw_graph.find_nodes(op="placeholder")
                    if not (is_tangent(n) or is_bwd_seed_offset(n) or is_backward_state(n))]
    tensors = [n for n in saved_inputs if not is_sym_node(n)]
    return (output, values, range(num_fwd_outputs, num_fwd_outputs + len(tensors)),
            {n.name: n for n in tensors})


def offload_obstacle(node: fx.Node, saved: Iterable[fx.Node],
                     user_outputs: Iterable[Any]) -> str | None:
    """Why forward node ``node`` cannot be offloaded, or None when it can. ``saved``: the
    cut's saved tensors (forward nodes); ``user_outputs``: the forward's user outputs."""
    if node not in (saved if isinstance(saved, (set, frozenset)) else set(saved)):
        return "not a saved tensor of this cut (recomputed in the backward, or not read by it)"
    if node.meta.get("recompute") == CheckpointPolicy.MUST_SAVE:
        return "tagged MUST_SAVE (stays on the device)"
    if node.op == "placeholder":
        return "a forward input (its caller holds it: offloading frees nothing)"
    if any(node is a for a in user_outputs):
        return "also a user output of the forward (its caller holds it)"
    val = node.meta.get("val")
    if is_opaque(node) or not isinstance(val, torch.Tensor):
        return "not a tensor"
    if val.layout != torch.strided or val.is_nested:
        return f"not a dense strided tensor ({val.layout})"
    if val._is_view() or (isinstance(node.target, torch._ops.OpOverload)
                          and (node.target.is_view or moves_nothing(node))):
        return "a view or alias (its base stays on the device)"
    if not _dense(val):
        return "not dense (overlapping or with gaps: a copy would not keep its strides)"
    if val.device.type not in ("cuda", "cpu"):
        return f"on {val.device.type!r} (only CUDA and CPU values are offloaded)"
    return None


def _dense(val: torch.Tensor) -> bool:
    """Its elements fill its storage span exactly once, in some order of the dimensions
    (a permutation of a contiguous tensor); sizes by their hints."""
    dims = sorted((size_hint(stride), size_hint(size))
                  for size, stride in zip(val.shape, val.stride()) if size_hint(size) != 1)
    if any(size == 0 for _, size in dims):
        return True
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def choose_offloads(fw_graph: fx.Graph, bw_graph: fx.Graph, num_fwd_outputs: int,
                    requested: Mapping[str, str], *, honour_tags: bool
                    ) -> tuple[dict[str, str], list[str]]:
    """(name -> who asked, notes): the ``requested`` names (name -> who asked; each must be
    offloadable, else ValueError naming it and why) and, with ``honour_tags``, the saved values
    tagged ``should_offload``; a tag that cannot be honoured gets a note, not an error."""
    _, outputs, slots, _ = _saved_layout(fw_graph, bw_graph, num_fwd_outputs)
    saved = {outputs[i] for i in slots}
    user_outputs = outputs[:num_fwd_outputs]
    by_name = {n.name: n for n in fw_graph.nodes}
    chosen: dict[str, str] = {}
    notes: list[str] = []
    if honour_tags:
        for node in fw_graph.nodes:
            if not node.meta.get(SHOULD_OFFLOAD):
                continue
            why = offload_obstacle(node, saved, user_outputs)
            if why is None:
                chosen[node.name] = "should_offload tag"
            else:
                notes.append(f"'{node.name}' is tagged should_offload but stays: {why}")
    for name, who in requested.items():
        node = by_name.get(name)
        why = ("not a node of the forward graph" if node is None
               else offload_obstacle(node, saved, user_outputs))
        if why is not None:
            offloadable = sorted(n.name for n in saved
                                 if offload_obstacle(n, saved, user_outputs) is None)
            shown = offloadable[:20] + ([f"... {len(offloadable) - 20} more"]
                                        if len(offloadable) > 20 else [])
            raise ValueError(f"cannot offload '{name}' ({who}): {why}; offloadable saved values "
                             f"of this cut: {shown}")
        chosen.setdefault(name, who)
    for note in notes:
        log.info("offload: %s", note)
    return chosen, notes


# ---- the rewrite --------------------------------------------------------------------------------

def _compute_seconds(node: fx.Node) -> float:
    """Roofline seconds of a node that runs a kernel (0 for the rest and our own ops)."""
    if (node.op != "call_function" or node.target in OFFLOAD_OPS
            or not isinstance(node.target, torch._ops.OpOverload) or "val" not in node.meta):
        return 0.0
    return float(estimate_runtime(node, "roofline"))


def _fake_result(op: Any, *args: Any) -> Any:
    """``op`` run on the args' fake values (nodes -> meta["val"]), in their fake mode."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    values = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        return op(*values)


def _mark(node: fx.Node, role: str, value: str, **facts: Any) -> None:
    node.meta[OFFLOAD_META] = {"role": role, "value": value, **facts}


def _new_node(graph: fx.Graph, op: Any, args: tuple[Any, ...], name: str, val: Any = None
              ) -> fx.Node:
    """A call of ``op``; its fake value is ``val`` (the waits return their first argument)
    or, when None, ``op`` run on the fake arguments."""
    node = graph.call_function(op, args)
    node.name = graph._graph_namespace.create_name(name, None)
    node.meta["val"] = _fake_result(op, *args) if val is None else val
    return node


def _forward_wait_index(order: list[fx.Node], start: int, last_use: int, seconds: float,
                        compute: Mapping[fx.Node, float]) -> tuple[int, float]:
    """(index of the node the wait follows, compute hidden): the first index at or after
    ``last_use`` where the compute since ``start`` covers ``seconds``, else the last one."""
    covered = 0.0
    for index in range(start + 1, len(order)):
        covered += compute[order[index]]
        if index >= last_use and covered >= seconds:
            return index, covered
    return len(order) - 1, covered


def _prefetch_index(order: list[fx.Node], first_non_input: int, first_use: int, seconds: float,
                    compute: Mapping[fx.Node, float]) -> tuple[int, float]:
    """(index of the node the prefetch precedes, compute hidden): the latest index whose
    compute up to ``first_use`` covers ``seconds``, else ``first_non_input``."""
    covered = 0.0
    for index in range(first_use - 1, first_non_input - 1, -1):
        covered += compute.get(order[index], 0.0)
        if covered >= seconds:
            return index, covered
    return first_non_input, covered


def _sink_aliases(graph: fx.Graph, value: fx.Node) -> None:
    """Move the views and aliases of ``value`` (``detach`` chains the joint puts at the top of
    the backward) down to right before the first node that reads it for real, so that the
    first use, where the prefetch must be done, is a real one. Moving a node later is legal:
    every reader of a moved node is a moved node (order kept) or at or after that point."""
    chain: list[fx.Node] = []
    readers: set[fx.Node] = set()
    frontier = [value]
    while frontier:
        for user in frontier.pop().users:
            if (user.op == "call_function" and isinstance(user.target, torch._ops.OpOverload)
                    and user.target not in OFFLOAD_OPS and moves_nothing(user)):
                if user not in chain:
                    chain.append(user)
                    frontier.append(user)
            else:
                readers.add(user)
    if not chain or not readers:
        return
    index = {n: i for i, n in enumerate(graph.nodes)}
    first_reader = min(readers, key=index.__getitem__)
    for node in sorted(chain, key=index.__getitem__):
        if index[node] < index[first_reader]:
            first_reader.prepend(node)


def offload_saved_values(fw_graph: fx.Graph, bw_graph: fx.Graph, chosen: Mapping[str, str], *,
                         num_fwd_outputs: int, bandwidth_gbps: float | None = None,
                         pinned: bool = True) -> list[OffloadedValue]:
    """Rewrite ``fw_graph`` and ``bw_graph`` (one cut, in place) so that each saved tensor
    named in ``chosen`` (name -> who asked, see ``choose_offloads``) is offloaded to host
    memory; returns what was done, in forward order. ``bandwidth_gbps``: the host link (the
    flag ``activation_offload_cpu_gpu_bw``), None for the device table's; ``pinned``: host
    copies in pinned memory (CUDA)."""
    if not chosen:
        return []
    output, outputs, slots, bw_saved = _saved_layout(fw_graph, bw_graph, num_fwd_outputs)
    saved = {outputs[i] for i in slots}
    saved_by_name = {n.name: n for n in saved}
    for name in chosen:
        node = saved_by_name.get(name)
        why = ("not a saved tensor of this cut" if node is None
               else offload_obstacle(node, saved, outputs[:num_fwd_outputs]))
        if why is not None:
            raise ValueError(f"cannot offload '{name}': {why}")
    # Each node's roofline seconds, once (the rewrite's own nodes count 0).
    compute = {n: _compute_seconds(n) for g in (fw_graph, bw_graph) for n in g.nodes}
    fw_order = [n for n in fw_graph.nodes if n.op != "output"]
    fw_index = {n: i for i, n in enumerate(fw_order)}
    done: list[OffloadedValue] = []
    new_outputs = list(outputs)
    for slot in slots:
        value = outputs[slot]
        if value.name not in chosen:
            continue
        placeholder = bw_saved.get(value.name)
        if placeholder is None or not placeholder.users:
            raise AssertionError(f"offload: the backward has no input '{value.name}' that reads "
                                 "the saved value")
        nbytes = node_nbytes(value)
        device = value.meta["val"].device
        seconds = nbytes / host_link_bandwidth(device, bandwidth_gbps)
        # forward: copy out as soon as it exists; wait (and free) once the copy is hidden
        last_use = max((fw_index[u] for u in value.users if u.op != "output"),
                       default=fw_index[value])
        wait_after, fw_hidden = _forward_wait_index(fw_order, fw_index[value], last_use, seconds,
                                                   compute)
        with fw_graph.inserting_after(value):
            host = _new_node(fw_graph, offload_to_host, (value, pinned), f"{value.name}_to_host")
        # (nothing after the value: the wait follows the copy itself)
        with fw_graph.inserting_after(host if wait_after == fw_index[value]
                                      else fw_order[wait_after]):
            host_ready = _new_node(fw_graph, wait_offload, (host, value),
                                   f"{value.name}_host_ready", host.meta["val"])
        new_outputs[slot] = host_ready
        # backward: the host copy arrives; prefetch it in time for its first use
        _sink_aliases(bw_graph, placeholder)
        bw_order = list(bw_graph.nodes)
        bw_index = {n: i for i, n in enumerate(bw_order)}
        first_non_input = next(i for i, n in enumerate(bw_order) if n.op != "placeholder")
        users = sorted(placeholder.users, key=bw_index.__getitem__)
        first_use = bw_index[users[0]]
        before, bw_hidden = _prefetch_index(bw_order, first_non_input, first_use, seconds,
                                            compute)
        placeholder.meta = {**placeholder.meta, "val": host.meta["val"]}  # meta is shared
        with bw_graph.inserting_before(bw_order[before]):
            # The device copy stands for the original value: the backward's views of it
            # (traced from the original) keep sharing its fake storage (memory simulator).
            fetched = _new_node(bw_graph, prefetch_to_device, (placeholder, device),
                                f"{value.name}_prefetch", value.meta["val"])
        with bw_graph.inserting_before(users[0]):
            ready = _new_node(bw_graph, wait_prefetch, (fetched, placeholder),
                              f"{value.name}_device_ready", value.meta["val"])
        for user in users:
            user.replace_input_with(placeholder, ready)
        record = OffloadedValue(
            value.name, nbytes, chosen[value.name], fw_order[wait_after].name,
            bw_order[before].name, users[0].name, seconds, fw_hidden, bw_hidden)
        facts = {"nbytes": nbytes, "seconds": seconds}
        _mark(host, "copy_out", value.name, **facts, hidden_seconds=fw_hidden)
        _mark(host_ready, "copy_out_done", value.name)
        _mark(placeholder, "host_copy", value.name)
        _mark(fetched, "prefetch", value.name, **facts, hidden_seconds=bw_hidden)
        _mark(ready, "prefetch_done", value.name)
        done.append(record)
        log.info("%s: %s; transfer %.3g s each way, hidden %.3g s (forward), %.3g s (backward)",
                 value.name, record.describe(), seconds, fw_hidden, bw_hidden)
    output.args = (tuple(new_outputs),)
    fw_graph.lint()
    bw_graph.lint()
    return done

