"""Each distinct graph lowered once per process for the memory model.

A peak cap prices candidate cuts by lowering them through Inductor (inductor.py's
``lower_for_memory``: about a second each on a small transformer, the main cost of a capped
compile). The same forward or backward graph comes back often: neighbouring candidates share
one of their two graphs, a refused cap is followed by a best-effort compile of the same step,
a step cap re-partitions a graph under another share, a sweep of budgets (``aot-pipeline
pareto``) prices the same cuts at every budget, a ``torch._dynamo.reset()`` recompiles it.
The lowering's result is a function of what the key below holds, so it is kept and handed
back instead of lowering again.

The key: the graph's code (and any subgraph's), every placeholder's static layout (shape,
strides, offset, dtype, device, which placeholders share a storage), the layout of each
attribute the graph reads, the scalar entries of every node's meta (stack traces and
sequence numbers aside: a pass may read a tag), the lowering's own arguments, Inductor's
config hash, and the process-wide settings that steer decompositions. A graph with symbolic
shapes is never kept (its sizes hang on a shape environment the key cannot hold). Failures
are never kept. ``AOT_PARTITION_LOWERING_MEMO=0`` turns the memo off; ``clear_lowering_memo``
empties it.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch
import torch.fx as fx

__all__ = ["LOWERING_MEMO_SIZE", "clear_lowering_memo", "lowering_memo_key",
           "lowering_memo_stats"]

# Lowered graphs kept (least recently used dropped first); each is a few KiB of events.
LOWERING_MEMO_SIZE = 512
# Meta entries that differ between equal graphs and steer no lowering.
_IGNORED_META = frozenset({"stack_trace", "seq_nr", "source_fn", "val", "tensor_meta",
                           "example_value", "original_aten", "from_node"})

T = TypeVar("T")


class _Memo(Generic[T]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: collections.OrderedDict[str, T] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> T | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: str, value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


MEMO: _Memo[Any] = _Memo(LOWERING_MEMO_SIZE)


def memo_enabled() -> bool:
    return os.environ.get("AOT_PARTITION_LOWERING_MEMO", "1") != "0"


def clear_lowering_memo() -> None:
    """Forget every lowered graph (the next pricing of each lowers it again)."""
    MEMO.clear()


def lowering_memo_stats() -> dict[str, int]:
    """Hits, misses and graphs kept since the process started (or the last clear)."""
    return {"hits": MEMO.hits, "misses": MEMO.misses, "kept": len(MEMO._items)}


def _is_symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _tensor_layout(tensor: torch.Tensor, storages: dict[int, int]) -> tuple[Any, ...] | None:
    sizes = (*tensor.shape, *tensor.stride(), tensor.storage_offset())
    if any(_is_symbolic(s) for s in sizes):
        return None
    try:
        storage = storages.setdefault(tensor.untyped_storage()._cdata, len(storages))
    except Exception:  # a tensor subclass without one storage: its own identity
        storage = storages.setdefault(id(tensor), len(storages))
    return (tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(),
            str(tensor.dtype), str(tensor.device), tensor.requires_grad, storage,
            type(tensor).__name__)


def _attribute(root: torch.nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _scalar_meta(node: fx.Node) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in node.meta.items()
                        if k not in _IGNORED_META
                        and isinstance(v, (str, int, float, bool, type(None)))))


def lowering_memo_key(gm: fx.GraphModule, values: Sequence[Any], *, is_backward: bool,
                      donated: Sequence[int], workspace: bool, user_outputs: int | None,
                      input_strides: Mapping[int, tuple[int, ...]] | None) -> str | None:
    """The key ``gm``'s lowering is kept under, or None when it must not be kept (symbolic
    shapes, a placeholder or attribute the key cannot describe)."""
    from torch._inductor import config as inductor_config

    storages: dict[int, int] = {}
    placeholders: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            layout = _tensor_layout(value, storages)
            if layout is None:
                return None
            placeholders.append(layout)
        elif _is_symbolic(value):
            return None
        elif value is None or isinstance(value, (int, float, bool)):
            placeholders.append(repr(value))
        else:
            return None
    attributes: list[Any] = []
    codes: list[str] = []
    for name, module in gm.named_modules():
        if not isinstance(module, fx.GraphModule):
            continue
        codes.append(f"{name}:{module.code}")
        for node in module.graph.find_nodes(op="get_attr"):
            attribute = _attribute(module, str(node.target))
            if isinstance(attribute, torch.Tensor):
                layout = _tensor_layout(attribute, storages)
                if layout is None:
                    return None
                attributes.append((name, node.target, layout))
            elif isinstance(attribute, fx.GraphModule):
                attributes.append((name, node.target, "graph"))  # its code is in ``codes``
            else:
                attributes.append((name, node.target, type(attribute).__name__))
    metas = [(n.name, _scalar_meta(n)) for n in gm.graph.nodes]
    settings = (inductor_config.get_hash().hex() if hasattr(inductor_config, "get_hash")
                else repr(sorted(inductor_config.get_config_copy().items())),
                str(torch.get_default_dtype()), torch.are_deterministic_algorithms_enabled(),
                torch.__version__)
    text = repr((codes, placeholders, attributes, metas, is_backward, tuple(donated),
                 workspace, user_outputs, sorted((input_strides or {}).items()), settings))
    return hashlib.sha256(text.encode()).hexdigest()
