"""The boxed calling convention of AOTAutograd compiled functions.

A *boxed* function takes its arguments as ONE list instead of ``*args``, so that it may clear
that list and free the inputs as soon as it no longer needs them. AOTAutograd recognises one by
its ``_boxed_call = True`` attribute and calls it as ``f(list_of_args)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch.fx as fx

BoxedFunction = Callable[[list[Any]], Any]


class Compiler(Protocol):
    """A graph compiler as AOTAutograd calls it: ``compiler(gm, example_inputs) -> callable``.

    Its parameter names are those of torch's ``AOTDispatchCompiler`` protocol, so a Compiler
    can be passed as ``fw_compiler`` / ``bw_compiler``.
    """

    def __call__(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]: ...


def is_boxed(fn: object) -> bool:
    """Whether ``fn`` follows the boxed convention (takes a single list of arguments)."""
    return bool(getattr(fn, "_boxed_call", False))


def make_boxed_func(fn: Callable[..., Any]) -> BoxedFunction:
    """Wrap an unboxed ``fn(*args)`` as a boxed ``g(args_list)``; boxed functions pass through."""
    if is_boxed(fn):
        return fn
    if not callable(fn):
        raise TypeError(f"make_boxed_func expects a callable, got {type(fn).__name__}: {fn!r}")

    def boxed(args: list[Any]) -> Any:
        if not isinstance(args, (list, tuple)):
            raise TypeError(
                f"boxed function {_name_of(fn)} takes ONE list of arguments, got "
                f"{type(args).__name__}; call it as f([x, y]) not f(x, y)"
            )
        return fn(*args)

    functools.update_wrapper(boxed, fn, assigned=("__module__", "__name__", "__qualname__",
                                                  "__doc__"), updated=())
    boxed._boxed_call = True  # type: ignore[attr-defined]
    return boxed


def make_boxed_compiler(compiler: Callable[..., Callable[..., Any]]) -> Compiler:
    """Turn ``compiler(gm, example_inputs) -> fn(*args)`` into one returning a boxed function."""
    if not callable(compiler):
        raise TypeError(
            f"make_boxed_compiler expects a compiler callable (gm, example_inputs) -> callable, "
            f"got {type(compiler).__name__}: {compiler!r}"
        )

    @functools.wraps(compiler)
    def boxed_compiler(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> BoxedFunction:
        return make_boxed_func(compiler(gm, example_inputs))

    return boxed_compiler


def _name_of(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
