"""Bytes held by a joint-graph node, with symbolic sizes replaced by their hints.

``size_hint`` is the one place a symbolic size becomes a number: the byte model here and the
runtime estimators both read sizes through it. ``saved_bytes`` is the one measure of what a
set of saved values keeps alive (views of inputs free, a view of an activation its base
once); everything that reports or caps saved bytes counts with it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import py_sym_types

from ..errors import MissingMetadataError
from ._compat import optimization_hint, saved_output_desc_type

# Stand-in size for unbacked symbols that have no hint (as torch's partitioner uses).
UNBACKED_FALLBACK = 4096


# Values a node may hold that are not opaque: tensors, symbolic and plain scalars, the
# containers of a multi-output op, and the backward state (it has its own slot).
_NOT_OPAQUE = (torch.Tensor, *py_sym_types, int, float, bool, str, list, tuple, dict,
               BackwardState)


def is_opaque_value(val: Any) -> bool:
    """An opaque object: a ``DeviceMesh`` or process group, any (fake) ``ScriptObject`` or
    registered opaque type; anything held in ``meta['val']`` that is not a tensor, a scalar,
    None, a tuple of outputs or backward state.

    The partitioner never sizes (0 bytes), prices or recomputes one: it is always available to
    the backward that needs it and is saved in the group of its own that AOTAutograd expects
    (after the tensors, before the symbolic scalars; extract.py).
    """
    return val is not None and not isinstance(val, _NOT_OPAQUE)


def is_opaque(node: fx.Node) -> bool:
    """``node`` holds an opaque object (see ``is_opaque_value``)."""
    return is_opaque_value(node.meta.get("val"))


def size_hint(value: int | torch.SymInt) -> int:
    """A concrete integer for a possibly symbolic size, without adding guards: the hint of a
    backed symbol, ``UNBACKED_FALLBACK`` for an unbacked one (as torch's optimization hints
    combine them in expressions)."""
    if type(value) is int:  # static: its own hint (called for every buffer a cut simulates)
        return value
    return int(optimization_hint(value, fallback=UNBACKED_FALLBACK))


def tensor_nbytes(value: torch.Tensor) -> int:
    numel = value.numel()
    if type(numel) is not int:  # symbolic: its hint
        numel = size_hint(numel)
    return numel * value.dtype.itemsize


def _value_nbytes(value: object) -> int:
    return tensor_nbytes(value) if isinstance(value, torch.Tensor) else 0


def sym_node_size(node: fx.Node) -> int:
    """Bytes charged for saving a symbolic scalar: ints/bools 1, floats 4 (as torch does)."""
    return 4 if isinstance(node.meta["val"], torch.SymFloat) else 1


def has_no_result(node: fx.Node) -> bool:
    target = node.target
    return node.op == "get_attr" or (
        isinstance(target, torch._ops.OpOverload) and len(target._schema.returns) == 0
    )


def node_nbytes(node: fx.Node) -> int:
    """Bytes of the value(s) ``node`` produces (tensors, tuples of tensors, symbolic scalars)."""
    if "val" not in node.meta:
        if has_no_result(node):
            return 0
        raise MissingMetadataError(node.name, str(node.target))
    val = node.meta["val"]
    if isinstance(val, py_sym_types):
        return 1
    if isinstance(val, torch.Tensor):
        return tensor_nbytes(val)
    if isinstance(val, (list, tuple)):
        return sum(_value_nbytes(v) for v in val)
    if isinstance(val, dict):
        return sum(_value_nbytes(v) for v in val.values())
    if val is None or isinstance(val, (int, float, bool)) or is_opaque_value(val):
        return 0  # an opaque object is never priced as memory
    raise TypeError(
        f"cannot size node '{node.name}': meta['val'] is a {type(val).__name__}; expected a "
        "tensor, a symbolic scalar, a tuple/list of tensors or an opaque object"
    )


# ---- the one measure of saved bytes ----------------------------------------------------------

def storage_key(value: torch.Tensor) -> int | None:
    """The identity of the storage ``value`` lives in (views share their base's), or None for
    a tensor without one (sparse, nested, functional wrappers)."""
    try:
        return int(value.untyped_storage()._cdata)
    except Exception:
        return None


def storage_nbytes(value: torch.Tensor) -> int:
    """Bytes of the storage ``value`` lives in (a view's: its whole base), hinted."""
    try:
        return size_hint(value.untyped_storage().nbytes())
    except Exception:
        return tensor_nbytes(value)


def size_expr(value: int | torch.SymInt) -> Any:
    """A size as a sympy expression of the shape symbols (an int when it is static)."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return int(expr) if expr.is_Integer else expr
    return int(value)


def storage_nbytes_expr(value: torch.Tensor) -> Any:
    """``storage_nbytes`` unhinted: a sympy expression of the shape symbols, or an int."""
    try:
        return size_expr(value.untyped_storage().nbytes())
    except Exception:
        return size_expr(value.numel()) * value.dtype.itemsize


def value_leaves(val: Any) -> list[Any]:
    """The items of a node's ``meta["val"]`` in order (tensors, scalars, None)."""
    return list(val) if isinstance(val, (list, tuple)) else [val]


def schema_alias_arg(node: fx.Node, index: int) -> fx.Node | None:
    """The argument the op schema says output ``index`` aliases (views, in-place ops)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    returns = target._schema.returns
    alias = returns[min(index, len(returns) - 1)].alias_info if returns else None
    if alias is None:
        return None
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.before_set & alias.before_set:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            return value if isinstance(value, fx.Node) else None
    return None


def _storage_index(node: fx.Node, key: int) -> int | None:
    """The index of ``node``'s output that lives in storage ``key``, or None."""
    return next((i for i, t in enumerate(value_leaves(node.meta.get("val")))
                 if isinstance(t, torch.Tensor) and storage_key(t) == key), None)


def alias_root(node: fx.Node, index: int = 0) -> tuple[fx.Node, int]:
    """(node, output index) that allocated the memory output ``index`` of ``node`` lives in.

    Follows views and aliases through the graph: an input whose fake tensor shares the storage
    (or, for tensors without one, the argument the op schema says the output aliases; a
    ``getitem`` of a tuple: the tuple's item). A placeholder root means graph-input memory."""
    val = value_leaves(node.meta.get("val"))[index] if "val" in node.meta else None
    key = storage_key(val) if isinstance(val, torch.Tensor) else None
    while True:
        if key is not None:
            found = next(((arg, i) for arg in node.all_input_nodes
                          if (i := _storage_index(arg, key)) is not None), None)
            if found is None:
                return node, index
            node, index = found
            continue
        source = node.args[0] if node.args else None
        item = node.args[1] if len(node.args) > 1 else None
        if (node.target is operator.getitem and isinstance(source, fx.Node)
                and isinstance(source.meta.get("val"), (list, tuple))
                and isinstance(item, int)):
            node, index = source, item
            continue
        base = schema_alias_arg(node, index)
        if base is None:
            return node, index
        node, index = base, 0


def saved_buffers(values: Iterable[fx.Node], *, symbolic: bool = False
                  ) -> dict[object, tuple[fx.Node, Any]]:
    """The memory ``values`` keep alive for the backward, one entry per buffer: its key ->
    (the first of ``values`` that holds it, its bytes). The one definition behind
    ``saved_bytes``.

    - a graph input (placeholder, get_attr) and any view of one: nothing, that memory lives
      anyway (a transposed weight costs no new bytes);
    - a view of an activation: its base's storage, once however many views of it are saved;
    - a symbolic scalar: ``sym_node_size`` (ints and bools 1, floats 4); backward state,
      opaque objects and plain scalars: nothing.

    ``symbolic``: sizes as sympy expressions of the shape symbols (``storage_nbytes_expr``)
    instead of their hints.
    """
    storage_size = storage_nbytes_expr if symbolic else storage_nbytes
    tensor_size = ((lambda t: size_expr(t.numel()) * t.dtype.itemsize) if symbolic
                   else tensor_nbytes)
    found: dict[object, tuple[fx.Node, Any]] = {}
    for node in values:
        val = node.meta.get("val")
        if isinstance(val, py_sym_types):
            found.setdefault(("sym", node), (node, sym_node_size(node)))
            continue
        for index, item in enumerate(value_leaves(val)):
            if not isinstance(item, torch.Tensor):
                continue
            root, root_index = alias_root(node, index)
            if root.op in ("placeholder", "get_attr"):
                continue
            key = storage_key(item)
            if key is not None:
                found.setdefault(key, (node, storage_size(item)))
                continue
            base = value_leaves(root.meta.get("val"))[root_index]
            nbytes = tensor_size(base if isinstance(base, torch.Tensor) else item)
            found.setdefault((root, root_index), (node, nbytes))
    return found


def saved_bytes(values: Iterable[fx.Node]) -> int:
    """THE measure of saved bytes: what saving ``values`` for the backward keeps alive beyond
    the graph's inputs (``saved_buffers``). The report, the byte caps, the region budgets, the
    Pareto sweep, the memory simulator and ``saved_activation_bytes`` all count with it."""
    return sum(nbytes for _, nbytes in saved_buffers(values).values())


def saved_bytes_expr(values: Iterable[fx.Node]) -> Any:
    """``saved_bytes`` as a sympy expression of the shape symbols (an int when static): what
    the measure is at every shape a dynamic graph runs."""
    return sum((nbytes for _, nbytes in saved_buffers(values, symbolic=True).values()), 0)


def forward_saved_outputs(fw_graph: fx.Graph | fx.GraphModule,
                          num_fwd_outputs: int | None = None) -> list[fx.Node]:
    """The forward graph's outputs past the user outputs: what it saves for the backward.

    ``num_fwd_outputs`` defaults to what the output node's AOTAutograd descriptors say (both
    our partitioners and torch's record them)."""
    graph = fw_graph.graph if isinstance(fw_graph, fx.GraphModule) else fw_graph
    output = next(iter(graph.find_nodes(op="output")))
    outs = list(output.args[0])
    if num_fwd_outputs is None:
        saved_type = saved_output_desc_type()
        descs = output.meta.get("desc")
        if saved_type is None or not descs or len(descs) != len(outs):
            raise ValueError(
                "saved_activation_bytes: this forward graph's output node carries no "
                "AOTAutograd descriptors; pass num_fwd_outputs (the number of user outputs)"
            )
        num_fwd_outputs = sum(not isinstance(d, saved_type) for d in descs)
    return [out for out in outs[num_fwd_outputs:] if isinstance(out, fx.Node)]


def saved_activation_bytes(fw_module: fx.GraphModule | fx.Graph,
                           num_fwd_outputs: int | None = None) -> int:
    """``saved_bytes`` of what a forward graph saves for the backward (any partitioner's:
    ``num_fwd_outputs`` as in ``forward_saved_outputs``)."""
    return saved_bytes(forward_saved_outputs(fw_module, num_fwd_outputs))
