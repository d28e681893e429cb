"""Differences between the supported torch releases (2.11 to 2.15), and the private torch
utilities we lean on, kept in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.experimental import symbolic_shapes

# torch 2.13 renamed ``hint_int`` to ``optimization_hint``; 2.11 has only the old name. Both
# take ``(value, fallback=...)`` and return a concrete int without adding guards. The one
# caller is ``sizes.size_hint``, which picks the fallback.
optimization_hint: Callable[..., int] = next(
    getattr(symbolic_shapes, name) for name in ("optimization_hint", "hint_int")
    if hasattr(symbolic_shapes, name))


def saved_output_descs(num_saved: int) -> list[Any] | None:
    """AOTAutograd output descriptors for saved activations, or None where torch has none."""
    try:
        from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
    except ImportError:  # pragma: no cover - every supported release has them
        return None
    return [SavedForBackwardsAOTOutput(i) for i in range(num_saved)]


def saved_output_desc_type() -> type | None:
    try:
        from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
    except ImportError:  # pragma: no cover
        return None
    return SavedForBackwardsAOTOutput


@contextlib.contextmanager
def real_kernels() -> Iterator[None]:
    """Make real tensors and run real kernels, also where the caller traces.

    Inside torch.compile the partitioner runs under AOTAutograd's FakeTensorMode: a tensor
    made there is fake (no data), and a kernel run on it under ``no_dispatch`` alone reads a
    null pointer (a segfault on CPU, an illegal memory access on CUDA that ends the process's
    CUDA context). So the active modes are set aside, then Python dispatch is off: the
    Python dispatch key and the Python dispatcher, which Dynamo and AOTAutograd turn on while
    they compile. Under the Python dispatcher a c10d collective's binding keeps the GIL while
    it queues the work on gloo, whose worker thread may be waiting for the GIL (to release the
    previous collective's tensors) under the queue's lock: back-to-back collectives deadlock
    (torch 2.11-2.15; test_distributed_decisions.py shows it)."""
    from torch.utils._mode_utils import no_dispatch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), no_dispatch(), torch._C._DisablePythonDispatcher():
        yield


def check_real_tensors(tree: Any, what: str) -> None:
    """Raise TypeError naming the first tensor in ``tree`` that is not a plain torch.Tensor
    (a fake or other subclass tensor has no data a kernel may read)."""
    from torch.utils import _pytree as pytree

    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and type(leaf) is not torch.Tensor:
            raise TypeError(f"{what}: got a {type(leaf).__name__} where a real tensor is needed")
