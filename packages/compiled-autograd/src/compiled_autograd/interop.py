"""The registry of functional backwards, shared with torch's own compiled autograd.

The C++ engine binds each built-in autograd node's functional backward (``MulBackward0``,
``AccumulateGrad``, ``validate_outputs``, ...) exactly once per process, through
``bind_function`` on whichever compiler instance is active the first time that node type is
captured. If torch's own compiled autograd captured a ``MulBackward0`` first, our instance is
never told about it, and vice versa. So:

* names bound through us go into :data:`functional_ops` AND are mirrored into torch's
  ``torch._dynamo.compiled_autograd.ops`` namespace when that module is already loaded (it is,
  whenever ``torch._dynamo`` is), so torch's compiled autograd keeps working after ours;
* a name we never saw is looked up in torch's namespace (read only) before giving up.

Nothing here imports ``torch._dynamo.compiled_autograd``; we only touch it via ``sys.modules``.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

_TORCH_MODULE = "torch._dynamo.compiled_autograd"


class FunctionalOp:
    """A bound C++ functional backward, callable from the captured graph."""

    def __init__(self, name: str, fn: Callable[..., Any], is_custom_function: bool) -> None:
        self.fn = fn
        self.is_custom_function = is_custom_function
        self.__name__ = name
        self.__qualname__ = name
        self.__module__ = "compiled_autograd.ops"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"compiled_autograd.ops.{self.__name__}"


class FunctionalRegistry:
    """Name -> :class:`FunctionalOp`; names of custom C++ functions get a counter suffix."""

    def __init__(self) -> None:
        self._ops: dict[str, Callable[..., Any]] = {}
        self._custom_counter: Counter[str] = Counter()

    def add(self, name: str, fn: Callable[..., Any], is_custom_function: bool,
            is_traceable: bool) -> str:
        if is_custom_function:
            base = "CppNode" + name
            name = f"{base}{self._custom_counter[base]}"
            self._custom_counter[base] += 1
        if name in self._ops:
            raise RuntimeError(f"functional backward {name!r} is already bound")
        op = FunctionalOp(name, fn, is_custom_function)
        if is_traceable:
            entry: Callable[..., Any] = torch._dynamo.allow_in_graph(op)
        else:
            # Dynamo cannot dry-run an untraceable C++ function: run it eagerly.
            entry = torch._dynamo.disable(op)
        self._ops[name] = entry
        _mirror_into_torch(name, entry)
        return name

    def get(self, name: str) -> Callable[..., Any]:
        entry = self._ops.get(name)
        if entry is None:
            entry = _adopt_from_torch(name)
            if entry is None:
                raise KeyError(
                    f"no functional backward named {name!r} was bound; the C++ engine binds "
                    f"each node type once per process (known: {sorted(self._ops)})")
            self._ops[name] = entry
        return entry

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)


functional_ops = FunctionalRegistry()


def _torch_namespace() -> Any:
    module = sys.modules.get(_TORCH_MODULE)
    return None if module is None else getattr(module, "ops", None)


def _mirror_into_torch(name: str, entry: Callable[..., Any]) -> None:
    namespace = _torch_namespace()
    if namespace is not None and not hasattr(namespace, name):
        setattr(namespace, name, entry)


def _adopt_from_torch(name: str) -> Callable[..., Any] | None:
    """A functional backward torch's compiled autograd bound before we ran, as our op."""
    namespace = _torch_namespace()
    found = None if namespace is None else getattr(namespace, name, None)
    if found is None:
        return None
    if isinstance(found, FunctionalOp):
        return found
    raw = getattr(found, "fn", None)
    if raw is None:  # torch wrapped an untraceable op: keep its eager-only wrapper
        logger.debug("adopting torch's wrapper for %s", name)
        return found
    logger.debug("adopting torch's binding of %s", name)
    op = FunctionalOp(name, raw, bool(getattr(found, "is_custom_function", False)))
    return torch._dynamo.allow_in_graph(op)



def enter_torch_region() -> tuple[Any, bool]:
    """Raise torch's ``in_compiled_autograd_region`` while one of our graphs runs; returns what
    :func:`leave_torch_region` needs to restore it (re-entrant: a hook may run a backward).

    Dynamo, AOTAutograd and Inductor read that module global (never an API) to recognise a
    compiled-autograd backward graph: only with it set does Inductor's input flattening take its
    pytree-free path for the stolen ``inputs`` list (``torch._dynamo.utils.flatten_graph_inputs``),
    do parameters count as static inputs, and does Dynamo skip the saved-tensors-hooks guard.
    Like the ``ops`` mirror above, it is touched only through ``sys.modules``: when torch's module
    is not loaded, nobody can be reading the flag, and we do nothing.
    """
    # Any: a module global that only some torch releases declare is written below.
    module: Any = sys.modules.get(_TORCH_MODULE)
    if module is None:
        return None, False
    prior = bool(getattr(module, "in_compiled_autograd_region", False))
    module.in_compiled_autograd_region = True
    return module, prior


def leave_torch_region(token: tuple[Any, bool]) -> None:
    module, prior = token
    if module is not None:
        module.in_compiled_autograd_region = prior
