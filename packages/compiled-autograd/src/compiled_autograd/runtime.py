"""What the engine runs on every compiled backward, cache hit or miss.

``end_capture`` returns ``(runtime_wrapper, compiled_fn)``; the engine caches both and calls
``runtime_wrapper(compiled_fn, inputs, sizes, scalars, hooks, packed_inputs)`` each time. The
wrapper adapts the engine's arguments to the graph the passes left (only the sizes it still
reads, CPU scalars moved to CUDA), refuses to run under a compiler that is not ours, and keeps
compiled autograd off while the graph itself runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from compiled_autograd import protocol
from compiled_autograd.interop import enter_torch_region, leave_torch_region
from compiled_autograd.state import STATE, CompilerFactory


class ForeignCompilerError(RuntimeError):
    """A graph we captured was about to run under a compiler that is not ours."""


def make_runtime_wrapper(used_sizes: list[int], to_cuda: list[int],
                         check_nans: bool) -> Callable[..., Any]:
    """The wrapper of one captured graph: ``used_sizes`` and ``to_cuda`` as the passes left
    them; ``check_nans`` when the capture ran in anomaly mode."""
    mark_dynamic = torch._dynamo.maybe_mark_dynamic

    def runtime_wrapper(compiled_fn: Callable[..., Any], inputs: list[Any], sizes: list[int],
                        scalars: list[Any], hooks: list[Any], packed_inputs: list[Any]) -> Any:
        STATE.runs += 1
        filtered: list[Any] = []
        for index in used_sizes:
            size = sizes[index]
            if size > 0:  # torch.empty(0, n) carries n as a (possibly dynamic) dimension
                holder = torch.empty(0, size)
                mark_dynamic(holder, 1)
                filtered.append(holder)
            else:
                filtered.append(size)
        for index in to_cuda:
            inputs[index] = inputs[index].pin_memory().cuda(non_blocking=True)
        # The compiled graph must not re-enter compiled autograd (e.g. Dynamo compiling it).
        installed, installed_dynamic = protocol.set_compiler(None, False)
        STATE.in_compiled_region = True
        region = enter_torch_region()
        try:
            if not isinstance(installed, CompilerFactory):
                raise ForeignCompilerError(
                    "the autograd engine's cache returned a graph captured by "
                    "compiled_autograd, but another compiled autograd (torch's own?) is "
                    f"installed now ({installed!r}); the engine's cache ignores which compiler "
                    "filled it. Call compiled_autograd.reset() before switching.")
            out = compiled_fn(inputs, filtered, scalars, hooks, packed_inputs)
        finally:
            leave_torch_region(region)
            STATE.in_compiled_region = False
            protocol.set_compiler(installed, installed_dynamic)
        if check_nans:
            _check_nans(out)
        return out

    return torch._dynamo.disable(runtime_wrapper)


def _check_nans(out: Any) -> None:
    bad = [i for i, t in enumerate(out or ()) if isinstance(t, torch.Tensor) and t.isnan().any()]
    if bad:
        raise RuntimeError(f"compiled autograd returned NaN gradients for outputs {bad} "
                           "(anomaly mode)")
