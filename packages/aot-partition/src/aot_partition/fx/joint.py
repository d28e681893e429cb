"""The AOTAutograd joint graph's conventions and plain graph walks, shared by every layer.

Which placeholders are primals, tangents, RNG seeds or backward state; where the forward
outputs end and the gradients begin; the aten packet of a node and whether it is random;
topological order, and the nodes computable from (or needed by) a set of others. Nothing here
depends on flags or on a partition in progress.

The graph walks of this package read a node's inputs from ``node._input_nodes``, the dict
behind ``all_input_nodes`` (same nodes, same order), where they run once per node or more:
``all_input_nodes`` copies it into a new list on every call (about 10 calls per node and
partition). Every supported torch release has it; ``tests/aot_partition/test_fx_internals``
checks that on each.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental._backward_state import BackwardState

from ..errors import GraphCycleError

# ---- placeholders ----------------------------------------------------------------------------

# Region memory budgets (regions.py) in node.meta["custom"]:
# torch's key (torch.fx.traceback.MEMORY_BUDGET_ANNOTATION_KEY in 2.13+), spelled out so the
# regions are read the same way on every supported torch.
TORCH_REGION_KEY = "_region_activation_memory_budget"
# Ours, for budgets in bytes (torch's key only takes a fraction).
BYTES_REGION_KEY = "aot_partition_region_memory_budget_bytes"


def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def is_bwd_seed_offset(node: fx.Node) -> bool:
    if node.op != "placeholder":  # asked of every node: skip formatting op targets
        return False
    target = str(node.target)
    return "bwd_seed" in target or "bwd_base_offset" in target


def is_fwd_seed_offset(node: fx.Node) -> bool:
    if node.op != "placeholder":
        return False
    target = str(node.target)
    return "fwd_seed" in target or "fwd_base_offset" in target


def is_backward_state(node: fx.Node) -> bool:
    return node.op == "placeholder" and isinstance(node.meta.get("val"), BackwardState)


def is_primal(node: fx.Node) -> bool:
    return (
        node.op == "placeholder"
        and "tangents" not in str(node.target)
        and not is_bwd_seed_offset(node)
        and not is_fwd_seed_offset(node)
    )


# ---- ops ------------------------------------------------------------------------------------

# Argument leaves that are plain Python scalars (the passes handle these inline, fast).
PLAIN_LEAVES = (int, float, bool, str, type(None))

_PACKETS: dict[Any, Any] = {}  # target -> packet: the policy asks tens of thousands of times


def aten_packet(node: fx.Node) -> Any:
    """The OpOverloadPacket of an aten op (``aten.add`` for ``aten.add.Tensor``), else target."""
    target = node.target
    try:
        return _PACKETS[target]
    except KeyError:
        packet = _PACKETS[target] = getattr(target, "overloadpacket", target)
        return packet
    except TypeError:  # an unhashable target
        return getattr(target, "overloadpacket", target)


def is_random(node: fx.Node) -> bool:
    """A call that draws from the RNG: its op is tagged ``nondeterministic_seeded``, unless its
    only randomness is a ``dropout_p`` argument of 0 (attention at ``dropout_p=0.0``: the same
    output every time, so recomputing it needs no replayed RNG state)."""
    return (node.op == "call_function" and is_seeded_target(node.target)
            and not _dropout_p_is_zero(node))


def random_calls(nodes: Iterable[fx.Node]) -> Iterator[fx.Node]:
    """The nodes of ``nodes`` that ``is_random``, each op's tags read once per walk (reading
    them costs more than the rest of the test; the walk's graph keeps the targets' ids)."""
    seeded: dict[int, bool] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        target = node.target
        verdict = seeded.get(id(target))
        if verdict is None:
            verdict = seeded[id(target)] = is_seeded_target(target)
        if verdict and not _dropout_p_is_zero(node):
            yield node


def is_seeded_target(target: Any) -> bool:
    """Whether ``target`` is tagged ``nondeterministic_seeded`` (it may draw from the RNG).

    A property of the op alone; whether one call draws depends on its arguments too
    (``is_random``), so a cache keyed on the op may hold this, never ``is_random``.
    """
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


# Set on a duplicate that common-subexpression merging detached (passes/cse.py) while it
# stays in the graph: no inputs, no users. Extraction must never copy it, even when fx
# deems its op impure (attention at dropout_p=0 is tagged nondeterministic_seeded).
MERGED_DUPLICATE_OF = "cse_merged_duplicate_of"


def is_merged_duplicate(node: fx.Node) -> bool:
    """A node CSE merged into another and detached; it computes nothing (see above)."""
    return MERGED_DUPLICATE_OF in node.meta


def _dropout_p_is_zero(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    for index, argument in enumerate(schema.arguments):
        if argument.name == "dropout_p":
            if index < len(node.args):
                value = node.args[index]
            else:
                value = node.kwargs.get("dropout_p", argument.default_value)
            return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
    return False


# ---- outputs, order and reachability ---------------------------------------------------------

def forward_and_backward_outputs(
    joint_module: fx.GraphModule, num_fwd_outputs: int
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(fw outputs, bw outputs, fw output descriptors, bw output descriptors)."""
    output = next(iter(joint_module.graph.find_nodes(op="output")))
    outputs = pytree.arg_tree_leaves(*output.args)
    descs = pytree.arg_tree_leaves(output.meta.get("desc", [None] * len(outputs)))
    if len(descs) != len(outputs):
        descs = [None] * len(outputs)
    if not 0 <= num_fwd_outputs <= len(outputs):
        raise ValueError(
            f"num_fwd_outputs={num_fwd_outputs} is out of range: the joint graph has "
            f"{len(outputs)} outputs (forward outputs first, then gradients)"
        )
    return (outputs[:num_fwd_outputs], outputs[num_fwd_outputs:],
            descs[:num_fwd_outputs], descs[num_fwd_outputs:])


def complete_tuple_values(graph: fx.Graph) -> list[fx.Node]:
    """Give ``meta["val"]`` to tuple-valued calls that lack it, from their ``getitem`` users.

    Inductor's auto_chunker (``torch._inductor.config.auto_chunker``) calls one chunk subgraph
    per chunk through ``invoke_subgraph`` and propagates fake values afterwards; the first
    call of a subgraph is left without a value (torch 2.13), though each of its outputs
    (``getitem``) has one. The tuple is those outputs, ``None`` where no ``getitem`` reads an
    index (an output nothing reads holds no memory after the call). A call with any other
    reader is left alone: sizing it then names it (MissingMetadataError). Returns the nodes
    completed."""
    completed = []
    for node in graph.nodes:
        if node.op != "call_function" or "val" in node.meta or not node.users:
            continue
        outputs: dict[int, Any] = {}
        for user in node.users:
            if (user.target is not operator.getitem or len(user.args) != 2
                    or not isinstance(user.args[1], int) or "val" not in user.meta):
                break
            outputs[user.args[1]] = user.meta["val"]
        else:
            node.meta["val"] = tuple(outputs.get(i) for i in range(max(outputs) + 1))
            completed.append(node)
    return completed


def check_topological_order(graph: fx.Graph) -> None:
    """Raise GraphCycleError naming the first node that reads a later one (and the cycle)."""
    seen: set[fx.Node] = set()
    for node in graph.nodes:
        if not seen.issuperset(node._input_nodes):  # one C call per node when in order
            arg = next(a for a in node._input_nodes if a not in seen)
            raise GraphCycleError(node.name, arg.name, _cycle_through(node, arg))
        seen.add(node)


def _cycle_through(node: fx.Node, arg: fx.Node) -> list[str] | None:
    """Names along the cycle node -> ... -> arg -> node (``arg`` depends on ``node``), if any."""
    parents: dict[fx.Node, fx.Node | None] = {node: None}
    stack = [node]
    while stack:  # walk users from node until arg
        cur = stack.pop()
        if cur is arg:
            path = []
            step: fx.Node | None = cur
            while step is not None:
                path.append(step.name)
                step = parents[step]
            return [*reversed(path), node.name]
        for user in cur.users:
            if user not in parents:
                parents[user] = cur
                stack.append(user)
    return None


def computable_from(graph: fx.Graph, inputs: Iterable[fx.Node]) -> set[fx.Node]:
    """Nodes computable from ``inputs`` alone (placeholders outside ``inputs`` are not)."""
    computable = set(inputs)
    for node in graph.nodes:
        if node in computable or node.op in ("placeholder", "output"):
            continue
        if computable.issuperset(node._input_nodes):
            computable.add(node)
    return computable


def ancestors_within(outputs: Iterable[Any], allowed: set[fx.Node]) -> set[fx.Node]:
    """Nodes in ``allowed`` that ``outputs`` transitively depend on (outputs included)."""
    seen: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node) and o in allowed]
    while stack:
        node = stack.pop()
        if node in seen or node not in allowed:
            continue
        seen.add(node)
        stack.extend(node._input_nodes)  # filtered when popped: one C call per node
    return seen
