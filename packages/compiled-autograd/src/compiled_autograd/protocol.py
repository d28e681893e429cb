"""How each supported torch release talks to the Python half of compiled autograd.

Every difference between torch 2.11, 2.13 and 2.15 that this package has to care about lives
here, so the rest of the package codes against one protocol: no other module reads
``torch.__version__``, probes torch for a feature, or guards an import of a torch internal
(``tests/compiled_autograd/test_ca_protocol_boundary.py`` keeps it so).

The C++ engine (``torch/csrc/dynamo/python_compiled_autograd.cpp``) holds one Python factory,
installed with ``torch._C._dynamo.compiled_autograd.set_autograd_compiler(factory, dynamic)``.
On a cache miss it calls ``factory()`` and then these methods on the instance, by name
(observed by wrapping torch's own instance on 2.11.0, 2.13.0 and 2.15.0):

==========================  ===================================================================
method                      arguments (all releases unless noted)
==========================  ===================================================================
begin_capture               inputs: list[Tensor], sizes: list[int], scalars: list[int|float],
                            origins: list[list[(int, str)]], accumulate_grad: bool,
                            check_nans: bool -> (compile id str, fake inputs, sym sizes, scalars)
set_node_origin             node_name: str, nodecall_index: int, pyobj: Function | None
bind_function               fn_name: str, fn: builtin, is_custom_function, is_traceable -> str
apply_functional            fn_name: str, grads: list, args: tuple, output_metadata: list
validate_outputs            fn_name: str, outputs: list, args: tuple, output_metadata: list
proxy_call_backward         inputs, output_metadatas, saved_tensors, backward_idx: int, ctx,
                            maybe_backward_state_idx: int | None, opaque_object_indices: list
call_copy_slices_prologue   inputs, base sizes/strides/offset, view sizes/strides/offset
call_copy_slices_epilogue   needs_input_grad, result, res, grad_slice
accumulate_grad             2.11: variable, grad, has_post_hooks -> None
                            2.13, 2.15: variable, variable_grad, grad, has_post_hooks -> Tensor
tensor_pre_hook             inputs: list, hook_id: int, i: int -> list
cpp_tensor_pre_hook         inputs: list, hook_id: int, i: int -> list
pre_hook                    inputs: list, hook_id: int -> list
post_hook                   outputs: list, inputs: list, hook_id: int -> list
post_acc_grad_hook          input: Tensor, hook_id: int -> list
unpack_hook                 hook_id: int, data_id: int -> Tensor
bind_backward_state         index: int -> BackwardState
log_compile_reasons         reasons: list[str]
end_capture                 outputs: list -> (runtime_wrapper, compiled_fn)
close                       (no arguments; called after end_capture or on an error)
==========================  ===================================================================

``runtime_wrapper(compiled_fn, inputs, sizes, scalars, hooks, packed_inputs)`` is what the engine
calls on every backward, cache hit or miss.

Two further release differences live outside the engine: how the backward of an AOTAutograd
``CompiledFunction`` exposes its prologue and epilogue (see :func:`aot_backward_prologue`), and
that the C++ engine binds each built-in node's functional backward only ONCE per process (a
``static bool`` in the generated code), into whichever compiler instance is active then. The
registry in :mod:`compiled_autograd.interop` deals with that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

SUPPORTED_RELEASES: tuple[tuple[int, int], tuple[int, int]] = ((2, 11), (2, 15))


class UnsupportedTorchError(RuntimeError):
    """The installed torch is outside the range whose compiled-autograd protocol we know."""


@dataclass(frozen=True)
class AccumulateGradCall:
    """One ``accumulate_grad`` call from the engine, named the same way on every release."""

    variable: Any
    variable_grad: Any  # the parameter's .grad when the engine passes it, else None
    grad: Any
    has_post_hooks: bool
    # 2.11 does not pass the current .grad, so the graph has to read it when it runs.
    read_current_grad_at_run_time: bool


@dataclass(frozen=True)
class Protocol:
    """What differs between the supported releases, as plain facts."""

    release: tuple[int, int]
    # 2.13 and later pass the parameter's current .grad to accumulate_grad and expect the new
    # gradient back; 2.11 passes (variable, grad, has_post_hooks) and expects None.
    accumulate_grad_passes_current_grad: bool
    # 2.13 and later keep the AOT backward prologue/epilogue on the CompiledFunction class;
    # 2.11 has module-level functional versions that take the metadata explicitly.
    aot_prologue_on_class: bool

    def unpack_accumulate_grad(self, args: Sequence[Any]) -> AccumulateGradCall:
        """The engine's ``accumulate_grad(*args)``, named; refuses an argument count this
        release does not use."""
        if self.accumulate_grad_passes_current_grad and len(args) == 4:
            variable, variable_grad, grad, has_post_hooks = args
            return AccumulateGradCall(variable, variable_grad, grad, has_post_hooks,
                                      read_current_grad_at_run_time=False)
        if not self.accumulate_grad_passes_current_grad and len(args) == 3:
            variable, grad, has_post_hooks = args
            return AccumulateGradCall(variable, None, grad, has_post_hooks,
                                      read_current_grad_at_run_time=True)
        raise RuntimeError(f"accumulate_grad got {len(args)} arguments; torch "
                           f"{torch.__version__} is not speaking a known protocol")

    def accumulate_grad_reply(self, new_grad: Any) -> Any:
        """What the engine expects back from ``accumulate_grad``: the new gradient (2.13 on)
        or None (2.11)."""
        return new_grad if self.accumulate_grad_passes_current_grad else None


def torch_release(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``version`` (default: the installed torch)."""
    text = version if version is not None else torch.__version__
    try:
        major, minor = (int(part) for part in text.split("+")[0].split(".")[:2])
    except ValueError as error:
        raise UnsupportedTorchError(f"cannot parse torch version {text!r}") from error
    return major, minor


def protocol_for(version: str | None = None) -> Protocol:
    """The protocol of ``version`` (default: the installed torch); refuses unknown releases."""
    release = torch_release(version)
    low, high = SUPPORTED_RELEASES
    if not low <= release <= high:
        shown = version if version is not None else torch.__version__
        raise UnsupportedTorchError(
            f"compiled_autograd supports torch {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
            f"the installed torch is {shown}. Install a supported torch release."
        )
    return Protocol(
        release=release,
        accumulate_grad_passes_current_grad=release >= (2, 13),
        aot_prologue_on_class=release >= (2, 13),
    )


_current: Protocol | None = None


def current() -> Protocol:
    """The installed torch's protocol (checked once)."""
    global _current
    if _current is None:
        _current = protocol_for()
        logger.debug("compiled-autograd protocol: %s", _current)
    return _current


# ---- the C++ switch ------------------------------------------------------------------------

def _engine() -> Any:
    return torch._C._dynamo.compiled_autograd


def set_compiler(factory: Callable[[], Any] | None, dynamic: bool) -> tuple[Any, bool]:
    """Install ``factory`` in the C++ engine; returns the prior ``(factory, dynamic)``."""
    prior = _engine().set_autograd_compiler(factory, dynamic)
    return prior[0], bool(prior[1])


def installed_compiler() -> tuple[Any, bool]:
    """The factory the C++ engine holds now (read by swapping and restoring)."""
    prior = set_compiler(None, False)
    set_compiler(*prior)
    return prior


def clear_cache() -> None:
    """Forget every graph the C++ engine cached (it does not key them by compiler)."""
    _engine().clear_cache()


def cache_is_empty() -> bool:
    return bool(_engine().is_cache_empty())


def set_verbose_logger(target: logging.Logger | None) -> None:
    """The C++ engine logs cache misses and node details through ``target.debug``."""
    _engine().set_verbose_logger(target)


def call_cpp_tensor_pre_hooks(hook_id: int, grad: torch.Tensor) -> torch.Tensor:
    return _engine().call_cpp_tensor_pre_hooks(hook_id, grad)


# ---- AOTAutograd backwards -----------------------------------------------------------------

def aot_backward_prologue(compiled_function: Any) -> Callable[..., Any]:
    """``prologue(saved_tensors, symints, opaque_objects, grads_list) -> list`` for one
    AOTAutograd ``CompiledFunction`` class."""
    if current().aot_prologue_on_class:
        return compiled_function._bw_prologue_fn
    from torch._functorch._aot_autograd import runtime_wrappers

    metadata = compiled_function.metadata
    subclass_metadata = compiled_function.maybe_subclass_metadata

    def prologue(saved: Sequence[Any], symints: Sequence[Any], opaque: Sequence[Any],
                 grads: Sequence[Any]) -> Any:
        # torch 2.11 and 2.12 only: the type-checked (locked) torch no longer has it.
        return runtime_wrappers._backward_prologue_functional(  # type: ignore[attr-defined]
            saved, symints, opaque, metadata, subclass_metadata, *grads)

    return prologue


def aot_backward_epilogue(compiled_function: Any) -> Callable[..., Any]:
    """``epilogue(outputs, make_subclass_override=None) -> tuple`` for one CompiledFunction."""
    if current().aot_prologue_on_class:
        epilogue_fn = compiled_function._bw_epilogue_fn

        def epilogue(outputs: Any, make_subclass_override: Any = None) -> Any:
            if compiled_function.maybe_subclass_metadata is None:
                return epilogue_fn(outputs)
            return epilogue_fn(outputs, make_subclass_override=make_subclass_override)

        return epilogue
    from torch._functorch._aot_autograd import runtime_wrappers

    metadata = compiled_function.metadata
    subclass_metadata = compiled_function.maybe_subclass_metadata

    def legacy_epilogue(outputs: Any, make_subclass_override: Any = None) -> Any:
        # torch 2.11 and 2.12 only: the type-checked (locked) torch no longer has it.
        return runtime_wrappers._backward_epilogue_functional(  # type: ignore[attr-defined]
            metadata, subclass_metadata, outputs, make_subclass_override=make_subclass_override)

    return legacy_epilogue


def aot_backward_module(compiled_function: Any) -> torch.fx.GraphModule:
    """The not-yet-compiled backward graph AOTAutograd keeps for compiled autograd."""
    info = compiled_function._lazy_backward_info
    if info is None:
        raise RuntimeError(
            "this torch.compile'd backward was loaded from AOTAutogradCache, which keeps no "
            "backward graph for compiled autograd; set TORCHINDUCTOR_AUTOGRAD_CACHE=0")
    if hasattr(info, "bw_module_fn"):  # cached variant: rebuild the module outside fake mode
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            return info.bw_module_fn()
    return info.bw_module
