"""Bytes held by a joint-graph node, with symbolic sizes replaced by their hints.

``size_hint`` is the one place a symbolic size becomes a number: the byte model here and the
runtime estimators both read sizes through it.
"""

from __future__ import annotations

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


def saved_activation_bytes(fw_module: fx.GraphModule, num_fwd_outputs: int | None = None) -> int:
    """Bytes of the tensors a forward graph saves for backward (outputs past the user outputs).

    ``num_fwd_outputs`` defaults to what the output node's AOTAutograd descriptors say (both our
    partitioners and torch's record them); symbolic scalars are not counted.
    """
    output = next(iter(fw_module.graph.find_nodes(op="output")))
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
    total = 0
    for out in outs[num_fwd_outputs:]:
        if isinstance(out, fx.Node) and isinstance(out.meta.get("val"), torch.Tensor):
            total += tensor_nbytes(out.meta["val"])
    return total
