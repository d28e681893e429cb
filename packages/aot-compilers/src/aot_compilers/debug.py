"""``debug_nop``: run a graph node by node and check each real value against ``meta["val"]``.

Tracing records, for every node, a fake value (``meta["val"]``) whose sizes and strides may be
symbolic (``s0``, ``2*s0``...). The interpreter binds each free symbol to the real integer it
first meets (placeholders first, so inputs fix the symbols) and then checks that every real
tensor has the recorded dtype, size and *significant* strides (strides of dimensions longer than
1; the others carry no layout information).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .boxed import make_boxed_compiler
from .errors import GraphMismatchError

log = logging.getLogger(__name__)

IntLike = int | torch.SymInt


def _expr_of(value: IntLike) -> sympy.Expr:
    if isinstance(value, torch.SymInt):
        return sympy.sympify(value.node.expr)
    return sympy.Integer(int(value))


class DebugInterpreter(fx.Interpreter):
    """An ``fx.Interpreter`` that checks each node's real result against its ``meta["val"]``."""

    def __init__(self, module: fx.GraphModule, **kwargs: Any) -> None:
        super().__init__(module, **kwargs)
        self.symbol_mapping: dict[sympy.Symbol, sympy.Integer] = {}
        self.checked_values = 0  # how many tensors were compared (lets tests see checks ran)

    # -- symbols -----------------------------------------------------------------------------
    def _unify(self, recorded: IntLike, real: int) -> int | None:
        """The recorded int with symbols substituted, binding a bare unbound symbol to ``real``.

        Returns None when the expression still holds unbound symbols (nothing to compare).
        """
        expr = _expr_of(recorded).xreplace(self.symbol_mapping)
        if isinstance(expr, sympy.Symbol):
            self.symbol_mapping[expr] = sympy.Integer(int(real))
            return int(real)
        expr = sympy.expand(expr)
        if expr.is_number:
            return int(expr)
        log.debug("cannot resolve %s with bindings %s; not checked", expr, self.symbol_mapping)
        return None

    def _bind_inputs(self, args: Iterable[Any]) -> None:
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        for node, arg in zip(placeholders, args):
            recorded = node.meta.get("val")
            if isinstance(recorded, torch.SymInt) and isinstance(arg, int):
                self._unify(recorded, arg)
            elif isinstance(recorded, torch.Tensor) and isinstance(arg, torch.Tensor):
                if recorded.dim() != arg.dim():
                    continue  # reported by the node check, with names
                for want, got in zip(recorded.size(), arg.size()):
                    self._unify(want, got)
                for want, got in zip(recorded.stride(), arg.stride()):
                    self._unify(want, got)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.symbol_mapping = {}
        self._bind_inputs(args)
        return super().run(*args, **kwargs)

    # -- checks ------------------------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if "val" in n.meta:
            self._check_node(n, n.meta["val"], result)
        return result

    def _check_node(self, n: fx.Node, recorded: Any, real: Any) -> None:
        recorded_leaves = pytree.tree_leaves(recorded)
        real_leaves = pytree.tree_leaves(real)
        # Only the leaf count is compared: a traced op may record a tuple where the real op
        # returns a list (or the reverse), which is harmless since outputs are read by getitem.
        if len(recorded_leaves) != len(real_leaves):
            raise GraphMismatchError(
                f"debug_nop: node {n.name!r} ({_target_name(n)}): recorded {len(recorded_leaves)} "
                f"output value(s) in meta['val'] but the real run produced {len(real_leaves)}"
            )
        for index, (want, got) in enumerate(zip(recorded_leaves, real_leaves)):
            if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
                self._check_tensor(n, index, want, got)
                self.checked_values += 1
            elif isinstance(got, torch.Tensor):
                raise GraphMismatchError(
                    f"debug_nop: node {n.name!r} ({_target_name(n)}) output {index}: recorded "
                    f"{type(want).__name__} {want!r} but the real value is a tensor "
                    f"{_describe_real(got)}"
                )
            elif isinstance(want, (int, torch.SymInt)) and type(got) is int:
                resolved = self._unify(want, got)
                if resolved is not None and resolved != got:
                    raise GraphMismatchError(
                        f"debug_nop: node {n.name!r} ({_target_name(n)}) output {index}: recorded "
                        f"int {want} (= {resolved}{self._where()}) but the real value is {got}"
                    )

    def _check_tensor(self, n: fx.Node, index: int, want: torch.Tensor, got: torch.Tensor) -> None:
        def fail(what: str, recorded: object, real: object) -> GraphMismatchError:
            return GraphMismatchError(
                f"debug_nop: node {n.name!r} ({_target_name(n)}) output {index}: {what} mismatch: "
                f"recorded {recorded} in meta['val'] but real value has {real}{self._where()} "
                f"(recorded {_describe_recorded(want)}; real {_describe_real(got)})"
            )

        if want.dtype != got.dtype:
            raise fail("dtype", want.dtype, got.dtype)
        if want.dim() != got.dim():
            raise fail("rank", tuple(want.size()), tuple(got.size()))
        sizes = [self._unify(w, g) for w, g in zip(want.size(), got.size())]
        if any(s is not None and s != g for s, g in zip(sizes, got.size())):
            raise fail("size", _show(want.size(), sizes), tuple(got.size()))
        if got.numel() == 0:
            return  # an empty tensor's strides carry no layout
        strides = [self._unify(w, g) if got.size(d) > 1 else None
                   for d, (w, g) in enumerate(zip(want.stride(), got.stride()))]
        if any(s is not None and s != g for s, g in zip(strides, got.stride())):
            raise fail("stride", _show(want.stride(), strides), tuple(got.stride()))

    def _where(self) -> str:
        if not self.symbol_mapping:
            return ""
        bound = ", ".join(f"{k}={v}" for k, v in sorted(self.symbol_mapping.items(), key=str))
        return f" where {bound}"


def _show(recorded: Iterable[IntLike], resolved: list[int | None]) -> str:
    recorded = tuple(recorded)
    if all(not isinstance(r, torch.SymInt) for r in recorded):
        return str(tuple(int(r) for r in recorded))
    as_ints = tuple("?" if r is None else r for r in resolved)
    return f"{tuple(str(r) for r in recorded)} aka {as_ints}".replace("'", "")


def _describe_recorded(t: torch.Tensor) -> str:
    size = ", ".join(str(s) for s in t.size())
    stride = ", ".join(str(s) for s in t.stride())
    return f"dtype={t.dtype}, size=({size}), stride=({stride})"


def _describe_real(t: torch.Tensor) -> str:
    return f"dtype={t.dtype}, size={tuple(t.size())}, stride={tuple(t.stride())}"


def _target_name(n: fx.Node) -> str:
    return str(n.target) if n.op == "call_function" else f"{n.op} {n.target}"


@make_boxed_compiler
def debug_nop(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A slow compiler: interpret ``gm`` and check every real value against ``meta["val"]``.

    Raises ``GraphMismatchError`` naming the node and both values on the first disagreement in
    dtype, size or significant strides.
    """
    return DebugInterpreter(gm).run
