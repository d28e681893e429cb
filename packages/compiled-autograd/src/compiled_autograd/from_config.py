"""What ``aot_config.dynamo.compiled_autograd = True`` means for this package.

torch's own flag makes every call of a ``torch.compile``'d function run under torch's compiled
autograd, so a ``loss.backward()`` made inside that call is captured. Ours mirrors that, but only
where you opt in, never behind torch's back:

* :func:`maybe_enable_from_config` is ``enable(compiler_fn)`` when the flag is on and a no-op
  otherwise;
* :func:`compile` is ``torch.compile(fn, **kwargs)`` whose every call runs inside
  :func:`maybe_enable_from_config` (the flag is read at call time, like a config patch).

Both refuse to run if torch's own ``torch._dynamo.config.compiled_autograd`` is also on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from compiled_autograd.engine import enable


def inductor_compiler(graph: torch.fx.GraphModule) -> Callable[..., Any]:
    """The default ``compiler_fn``: Inductor over the whole captured backward."""
    return torch.compile(graph, backend="inductor", fullgraph=True)


def flag_is_on() -> bool:
    from aot_config import dynamo as dynamo_config

    return bool(dynamo_config.compiled_autograd)


def maybe_enable_from_config(
        compiler_fn: Callable[..., Any] | None = None) -> contextlib.AbstractContextManager:
    """``enable(compiler_fn or inductor_compiler)`` if the config flag is on, else a no-op."""
    if not flag_is_on():
        return contextlib.nullcontext()
    return enable(compiler_fn or inductor_compiler)


def compile(fn: Callable[..., Any], *, compiler_fn: Callable[..., Any] | None = None,
            **torch_compile_kwargs: Any) -> Callable[..., Any]:
    """``torch.compile(fn)`` whose backward calls are captured while the flag is on."""
    if not callable(fn):
        raise TypeError("compiled_autograd.compile expects a function or nn.Module, "
                        f"got {type(fn).__name__}")
    compiled = torch.compile(fn, **torch_compile_kwargs)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with maybe_enable_from_config(compiler_fn):
            return compiled(*args, **kwargs)

    return run
