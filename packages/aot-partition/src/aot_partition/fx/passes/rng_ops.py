"""The two operators the RNG replay puts into graphs, usable under any dispatch mode.

``run_and_save_rng_state(op, *args)`` returns (the RNG state before the call, ``op(*args)``);
``run_with_rng_state(state, op, *args)`` runs ``op(*args)`` from ``state`` and puts the
generator back where it was. They mirror torch's ``torch._prims.rng_prims`` operators of the
same names, with one difference: torch's raise ``NotImplementedError`` under any
TorchDispatchMode that has no rule of its own for them (a user's op counter, a memory tracker,
``FlopCounterMode``), since a higher-order operator dispatches on the mode's exact type.
Users wrap training in such modes, so ours run their decomposition under a mode they have no
rule for: the mode sees the op inside (``native_dropout``), as in eager. A mode that handles
higher-order operators itself (``supports_higher_order_operators``) is asked first; if it
returns NotImplemented (``FlopCounterMode`` does), the decomposition runs.

Tracing (fake tensors, proxies, functionalization) and Inductor (a fallback kernel) handle
them as torch's. ``str()`` of each is torch's name, so Inductor keeps both out of CUDA graphs
exactly as it keeps torch's (it matches ops by that name): a captured graph would replay a
stale RNG state.
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._higher_order_ops.utils import autograd_not_implemented
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    disable_proxy_modes_tracing,
    track_tensor_tree,
)
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

log = logging.getLogger(__name__)

__all__ = ["register_inductor_fallbacks", "run_and_save_rng_state", "run_with_rng_state"]


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    """The device whose generator the op draws from: its ``device=``, else its first tensor's
    or device argument's (Inductor's ``inductor_seeds(count, device)`` has no tensor)."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for value in pytree.tree_leaves(args):
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, torch.device):
            return value
    return torch.device("cpu")


def _get_state(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "cpu":
        return torch.get_rng_state()
    raise RuntimeError(f"RNG replay supports CPU and CUDA generators, not {device.type!r}")


def _set_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state.cpu(), device)
    else:
        torch.set_rng_state(state)


def _save_and_run(op: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    return _get_state(_device_of(args, kwargs)), op(*args, **kwargs)


def _run_from(state: torch.Tensor, op: Any, *args: Any, **kwargs: Any) -> Any:
    device = _device_of(args, kwargs)
    current = _get_state(device)
    _set_state(device, state)
    try:
        return op(*args, **kwargs)
    finally:
        _set_state(device, current)


def _hop_init_kwargs() -> dict[str, Any]:
    """``cacheable=True`` (graphs holding the op may be cached) where this torch has it."""
    parameters = inspect.signature(HigherOrderOperator.__init__).parameters
    return {"cacheable": True} if "cacheable" in parameters else {}


class _ModeTransparentOperator(HigherOrderOperator):
    """A higher-order operator that runs under any TorchDispatchMode (see the module doc)."""

    def __init__(self, name: str, torch_name: str, decomposition: Any) -> None:
        super().__init__(name, **_hop_init_kwargs())
        self._torch_name = torch_name
        self._decomposition = decomposition

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)

    def __str__(self) -> str:
        return self._torch_name

    def dispatch(self, /, dispatch_key: Any, *args: Any, **kwargs: Any) -> Any:
        if dispatch_key == DispatchKey.Python:
            mode = _get_current_dispatch_mode()
            if mode is not None and type(mode) not in self.python_key_table:
                return self._under_mode(mode, args, kwargs)
        return super().dispatch(dispatch_key, *args, **kwargs)

    def _under_mode(self, mode: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if getattr(mode, "supports_higher_order_operators", False):
            with _pop_mode_temporarily():
                result = mode.__torch_dispatch__(self, [], args, kwargs)
            if result is not NotImplemented:
                return result
        # The mode stays current: every op of the decomposition dispatches to it.
        return self._decomposition(*args, **kwargs)


run_and_save_rng_state = _ModeTransparentOperator(
    "aot_partition_run_and_save_rng_state", "run_and_save_rng_state", _save_and_run)
run_with_rng_state = _ModeTransparentOperator(
    "aot_partition_run_with_rng_state", "run_with_rng_state", _run_from)

for _operator in (run_and_save_rng_state, run_with_rng_state):
    _operator.py_impl(DispatchKey.Autograd)(
        autograd_not_implemented(_operator, deferred_error=True))
    # A call with no tensor argument (inductor_seeds) dispatches on BackendSelect alone.
    for _key in (DispatchKey.CPU, DispatchKey.CUDA, DispatchKey.BackendSelect):
        _operator.py_impl(_key)(_operator._decomposition)


@run_and_save_rng_state.py_impl(FakeTensorMode)
def _save_and_run_fake(mode: FakeTensorMode, op: Any, *args: Any, **kwargs: Any) -> Any:
    device = _device_of(args, kwargs)
    # The state's size without touching a generator (a fake CUDA tensor needs no GPU).
    nbytes = 16 if device.type == "cuda" else torch.get_rng_state().numel()
    with mode:
        return torch.empty(nbytes, dtype=torch.uint8), op(*args, **kwargs)


@run_with_rng_state.py_impl(FakeTensorMode)
def _run_from_fake(mode: FakeTensorMode, state: Any, op: Any, *args: Any, **kwargs: Any
                   ) -> Any:
    with mode:  # fake tensors draw nothing: no state to set
        return op(*args, **kwargs)


def _traced(operator: HigherOrderOperator, mode: ProxyTorchDispatchMode, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
    with disable_proxy_modes_tracing():
        out = operator(*args, **kwargs)
    proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, args)  # type: ignore[union-attr]
    proxy_kwargs = pytree.tree_map(mode.tracer.unwrap_proxy, kwargs)  # type: ignore[union-attr]
    out_proxy = mode.tracer.create_proxy("call_function", operator, proxy_args, proxy_kwargs)
    return track_tensor_tree(out, out_proxy, constant=None, tracer=mode.tracer)


@run_and_save_rng_state.py_impl(ProxyTorchDispatchMode)
def _save_and_run_traced(mode: ProxyTorchDispatchMode, *args: Any, **kwargs: Any) -> Any:
    return _traced(run_and_save_rng_state, mode, args, kwargs)


@run_with_rng_state.py_impl(ProxyTorchDispatchMode)
def _run_from_traced(mode: ProxyTorchDispatchMode, *args: Any, **kwargs: Any) -> Any:
    return _traced(run_with_rng_state, mode, args, kwargs)


def _functionalized(operator: HigherOrderOperator) -> None:
    @operator.py_functionalize_impl
    def impl(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        unwrapped_args = ctx.unwrap_tensors(args)
        unwrapped_kwargs = ctx.unwrap_tensors(kwargs)
        with ctx.redispatch_to_next():
            return ctx.wrap_tensors(operator(*unwrapped_args, **unwrapped_kwargs))


_functionalized(run_and_save_rng_state)
_functionalized(run_with_rng_state)


def register_inductor_fallbacks() -> None:
    """Let Inductor compile graphs holding the two operators: each runs as a fallback kernel,
    as torch's do. Called when the replay puts one into a graph; a no-op while Inductor's
    lowerings are not imported (importing them costs seconds): importing
    ``torch._inductor.compile_fx``, as every Inductor caller has by then, imports them."""
    lowering = sys.modules.get("torch._inductor.lowering")
    if lowering is None:
        return
    for operator in (run_and_save_rng_state, run_with_rng_state):
        if operator not in lowering.lowerings:
            lowering.make_fallback(operator)
            log.debug("registered an Inductor fallback for %s", operator.__name__)
