"""TorchScript compilers: ``ts_compile``, ``simple_ts_compile`` and ``nnc_jit``.

TorchScript is deprecated in recent torch releases. Every step this module needs is looked up
by name when it runs; a missing step raises ``TorchScriptUnavailableError`` naming it, and a step
that fails on a graph raises ``TorchScriptCompileError`` naming it: a step is never skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx

from .boxed import make_boxed_compiler
from .errors import TorchScriptCompileError, TorchScriptUnavailableError

log = logging.getLogger(__name__)

# (owner, attribute) of every TorchScript entry point used below, for one clear availability check.
_REQUIRED_STEPS: dict[str, tuple[Any, str]] = {
    "torch.jit.script": (torch.jit, "script"),
    "torch.jit.freeze": (torch.jit, "freeze"),
    "torch.jit.optimize_for_inference": (torch.jit, "optimize_for_inference"),
    "torch._C._jit_pass_remove_mutation": (torch._C, "_jit_pass_remove_mutation"),
    "torch._C._jit_set_autocast_mode": (torch._C, "_jit_set_autocast_mode"),
}


def _step(name: str) -> Callable[..., Any]:
    owner, attribute = _REQUIRED_STEPS[name]
    fn = getattr(owner, attribute, None)
    if fn is None:
        raise TorchScriptUnavailableError(
            f"{name} is not available in torch {torch.__version__}; the TorchScript compilers "
            f"(ts_compile, simple_ts_compile, nnc_jit, aot_torchscript) cannot run here. Use nop or "
            f"torch.compile(backend='inductor') instead"
        )
    return fn


@contextlib.contextmanager
def _running(step: str) -> Iterator[None]:
    """Re-raise a failure inside ``step`` as a ``TorchScriptCompileError`` naming the step."""
    try:
        yield
    except (TorchScriptUnavailableError, TorchScriptCompileError):
        raise
    except Exception as error:
        raise TorchScriptCompileError(
            f"ts_compile step {step!r} failed on torch {torch.__version__}: "
            f"{type(error).__name__}: {error}"
        ) from error


@contextlib.contextmanager
def jit_autocast_disabled() -> Iterator[None]:
    """Turn TorchScript's own autocast pass off (AOT graphs already carry their casts)."""
    set_mode = _step("torch._C._jit_set_autocast_mode")
    previous = set_mode(False)
    try:
        yield
    finally:
        set_mode(previous)


@contextlib.contextmanager
def _outside_tracing_modes() -> Iterator[None]:
    """Leave the fake-tensor mode AOTAutograd keeps active while it calls compilers:
    TorchScript's freeze folds constants with real ops, which fake tensors cannot answer."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def strip_overloads(gm: fx.GraphModule) -> fx.GraphModule:
    """Replace ``aten.op.overload`` targets by their packet ``aten.op`` (TorchScript needs that)."""
    for node in gm.graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
    gm.recompile()
    return gm


def canonicalize_to_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite dtype-only ``aten._to_copy(x, dtype=d)`` as ``aten.to(x, dtype=d)``.

    ``_to_copy`` with only a dtype is what a ``.to(dtype)`` call traces to; TorchScript handles
    ``aten.to`` better. Calls with other arguments (device, layout, memory format) stay.
    """
    to_copy_targets = (torch.ops.aten._to_copy, torch.ops.aten._to_copy.default)
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target in to_copy_targets
                and len(node.args) == 1 and set(node.kwargs) == {"dtype"}):
            node.target = torch.ops.aten.to
    gm.recompile()
    return gm


def devices_as_strings(gm: fx.GraphModule) -> fx.GraphModule:
    """Write ``torch.device`` keyword arguments as strings (TorchScript cannot parse the
    ``device(type='cpu')`` that FX prints). The index is kept: ``cuda:1`` stays ``cuda:1``."""
    for node in gm.graph.nodes:
        if any(isinstance(v, torch.device) for v in node.kwargs.values()):
            node.kwargs = {k: str(v) if isinstance(v, torch.device) else v
                           for k, v in node.kwargs.items()}
    gm.recompile()
    return gm


def _eager_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A plain ``GraphModule`` sharing ``gm``'s graph: ``torch.jit.script`` cannot compile the
    ``_LazyGraphModule`` that ``torch.compile`` hands to back ends (its forward is a stub)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # a torch without lazy graph modules: every module is eager already
        return gm
    if isinstance(gm, _LazyGraphModule):
        return fx.GraphModule(gm, gm.graph)
    return gm


def _has_fake(inputs: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(t, FakeTensor) for t in inputs)


@make_boxed_compiler
def ts_compile(gm: fx.GraphModule, example_inputs: list[Any]) -> torch.jit.ScriptModule:
    """Compile ``gm`` with TorchScript for inference-style execution.

    Steps, in order, with JIT autocast off: strip overloads, canonicalize dtype-only
    ``_to_copy``, devices as strings, script, remove mutation, freeze, optimize for inference,
    and one warm-up run on real example inputs (skipped for fake inputs, which cannot run).
    Mutates ``gm`` in place, as the seed did.
    """
    for name in _REQUIRED_STEPS:
        _step(name)
    with _outside_tracing_modes(), jit_autocast_disabled():
        with _running("strip overloads"):
            strip_overloads(gm)
        with _running("canonicalize _to_copy"):
            canonicalize_to_copy(gm)
        with _running("devices as strings"):
            devices_as_strings(gm)
            gm.graph.lint()
        with _running("torch.jit.script"):
            scripted = _step("torch.jit.script")(_eager_graph_module(gm))
        with _running("remove mutation"):
            _step("torch._C._jit_pass_remove_mutation")(scripted.graph)
        with _running("torch.jit.freeze"):
            scripted = _step("torch.jit.freeze")(scripted.eval())
        with _running("torch.jit.optimize_for_inference"):
            scripted = _step("torch.jit.optimize_for_inference")(scripted)
        if not _has_fake(example_inputs):
            with _running("warm-up run"):
                scripted(*example_inputs)
    log.debug("ts_compile scripted a graph of %d nodes", len(gm.graph.nodes))
    return scripted


@make_boxed_compiler
def simple_ts_compile(gm: fx.GraphModule, example_inputs: list[Any]) -> torch.jit.ScriptModule:
    """Strip overloads, script and freeze ``gm``: TorchScript without the inference passes."""
    with _outside_tracing_modes():
        with _running("strip overloads"):
            strip_overloads(gm)
        with _running("torch.jit.script"):
            scripted = _step("torch.jit.script")(_eager_graph_module(gm))
        with _running("torch.jit.freeze"):
            return _step("torch.jit.freeze")(scripted.eval())


def nnc_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``aot_function(fn, simple_ts_compile)``: forward and backward each scripted."""
    from torch._functorch.aot_autograd import aot_function

    _step("torch.jit.script")
    return aot_function(fn, simple_ts_compile)
