"""What ``aot_config.dynamo.compiled_autograd = True`` means for this package.

torch's own flag makes every call of a ``torch.compile``'d function run under torch's compiled
autograd, so a ``loss.backward()`` made inside that call is captured. Ours mirrors that, but only
where you opt in, never behind torch's back:

* :func:`maybe_enable_from_config` is ``enable(compiler_fn)`` when the flag is on and a no-op
  otherwise;
* :func:`compile` is ``torch.compile(fn, **kwargs)``; when the flag is on *at that moment*, every
  call of the result runs inside ``enable(compiler_fn)``.

:func:`compile` reads the flag once, when it is called, exactly as ``torch.compile`` reads
``torch._dynamo.config.compiled_autograd`` (``OptimizeContext.__init__`` adds the compiled-autograd
hook there, or not): flipping the flag afterwards changes nothing for a function already compiled,
and code ported from torch (``config.patch(compiled_autograd=True)`` around ``torch.compile``,
calls outside it) keeps capturing. Compile again to change it.

Both refuse to run if torch's own ``torch._dynamo.config.compiled_autograd`` is also on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from compiled_autograd.engine import enable, refuse_torch_flag


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
    """``torch.compile(fn)`` whose backward calls are captured if the flag is on now.

    The flag is read here, once (see the module docstring): on, every call of the result runs
    inside ``enable(compiler_fn or inductor_compiler)``, whatever the flag says by then; off, the
    result is plain ``torch.compile(fn, **torch_compile_kwargs)``.
    """
    if not callable(fn):
        raise TypeError("compiled_autograd.compile expects a function or nn.Module, "
                        f"got {type(fn).__name__}")
    if not flag_is_on():
        return torch.compile(fn, **torch_compile_kwargs)
    refuse_torch_flag()  # else torch.compile would add torch's own compiled autograd as well
    chosen = compiler_fn or inductor_compiler  # one object for every call: one cache owner
    compiled = torch.compile(fn, **torch_compile_kwargs)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with enable(chosen):
            return compiled(*args, **kwargs)

    return run
