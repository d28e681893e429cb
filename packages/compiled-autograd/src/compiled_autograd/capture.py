"""The compiler instance the C++ autograd engine drives while it captures one backward.

The engine walks the autograd graph itself; for every node it calls one of this class's methods
by name (the table in :mod:`compiled_autograd.protocol`). This class is that surface: it records
the calls of built-in and Python autograd nodes and hands everything else to the module whose
job it is:

* :mod:`compiled_autograd.tracing`: fake values bound to FX proxies, recording calls;
* :mod:`compiled_autograd.hooks`: one graph node per hook;
* :mod:`compiled_autograd.aot_backward`: AOTAutograd backwards pasted in node by node;
* :mod:`compiled_autograd.finish`: the clean-up passes, then ``compiler_fn``;
* :mod:`compiled_autograd.runtime`: the wrapper the engine runs on every backward.

By :meth:`AutogradCompilerInstance.end_capture` the whole backward is one FX graph with the
signature ``(inputs, sizes, scalars, hooks, packed_data)``.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

from compiled_autograd import hooks, logs, protocol
from compiled_autograd.aot_backward import AotBackwardPaster, is_aot_backward
from compiled_autograd.finish import compile_graph, finish_graph
from compiled_autograd.graph_ops import (
    call_accumulate_grad,
    call_backward,
    copy_slices_epilogue,
    copy_slices_prologue,
    end_of_backward,
)
from compiled_autograd.interop import functional_ops
from compiled_autograd.runtime import make_runtime_wrapper
from compiled_autograd.state import STATE
from compiled_autograd.tracing import BackwardTracer, placeholder_tensor

logger = logging.getLogger(__name__)

_capture_ids = itertools.count()


class AutogradCompilerInstance:
    """One capture: created by the engine on a cache miss, driven by it, then discarded."""

    def __init__(self, compiler_fn: Callable[..., Any]) -> None:
        self.compiler_fn = compiler_fn
        self.protocol = protocol.current()
        self.stack = contextlib.ExitStack()
        self.tracer = BackwardTracer()
        self.id = -1

    def close(self) -> None:
        self.stack.close()

    # ---- start and end -----------------------------------------------------------------------

    def begin_capture(self, inputs: list[torch.Tensor], sizes: list[int],
                      scalars: list[int | float], origins: list[list[tuple[int, str]]],
                      accumulate_grad: bool, check_nans: bool) -> tuple[str, list, list, list]:
        STATE.captures += 1
        self.id = next(_capture_ids)
        self.check_nans = check_nans
        self.aot_backwards = AotBackwardPaster(self.tracer)  # paste counts are per capture
        inputs, sym_sizes, scalars = self.tracer.start(self.stack, inputs, sizes, scalars,
                                                       origins, self.set_node_origin)
        return f"compiled_autograd.capture{self.id}", inputs, sym_sizes, scalars

    def end_capture(self, outputs: Any) -> tuple[Callable[..., Any], Any]:
        self.tracer.record(end_of_backward, ())
        self.stack.close()  # out of the fake and proxy modes before the graph is finished
        graph = self.tracer.record_output(outputs)
        finished = finish_graph(self.tracer.root, graph, self.id)
        compiled_fn = compile_graph(self.compiler_fn, finished.module)
        runtime_wrapper = make_runtime_wrapper(finished.used_sizes, finished.cpu_scalars_to_cuda,
                                               self.check_nans)
        return runtime_wrapper, compiled_fn

    def log_compile_reasons(self, compile_reasons: list[str]) -> None:
        logger.info("capture %d: cache miss because %s", self.id, "; ".join(compile_reasons))

    def set_node_origin(self, node_name: str, nodecall_index: int, pyobj: Any = None) -> None:
        """Tag the nodes recorded next with the autograd node they came from (as torch does:
        ``CompiledFunctionBackward<aot id> (NodeCall 2)`` for an AOTAutograd backward)."""
        aot_id = ""
        forward_cls = getattr(pyobj, "_forward_cls", None)
        if forward_cls is not None and is_aot_backward(forward_cls):
            aot_id = str(forward_cls._aot_id)
        logs.set_node_origin(node_name, nodecall_index, aot_id)

    # ---- autograd nodes ----------------------------------------------------------------------

    def bind_function(self, fn_name: str, fn: Callable[..., Any], is_custom_function: bool,
                      is_traceable: bool) -> str:
        return functional_ops.add(fn_name, fn, is_custom_function, is_traceable)

    def apply_functional(self, fn_name: str, grads: Sequence[Any], args: Any,
                         output_metadata: Sequence[Any]) -> list[torch.Tensor]:
        return self.tracer.record_call(functional_ops.get(fn_name), (grads, *args),
                                       output_metadata)

    def validate_outputs(self, fn_name: str, outputs: Sequence[Any], args: Any,
                         output_metadata: Sequence[Any]) -> Sequence[Any]:
        proxy_args = pytree.tree_map(self.tracer.to_proxy, (outputs, *args))
        proxies = self.tracer.record(functional_ops.get(fn_name), proxy_args)
        self.tracer.bind(outputs, proxies)
        return outputs

    def call_copy_slices_prologue(self, inputs: Sequence[Any], base_sizes: Sequence[Any],
                                  base_strides: Sequence[Any], base_storage_offset: Any,
                                  view_sizes: Sequence[Any], view_strides: Sequence[Any],
                                  view_storage_offset: Any) -> list[torch.Tensor]:
        args = (inputs, base_sizes, base_strides, base_storage_offset, view_sizes,
                view_strides, view_storage_offset)
        return self.tracer.record_call(copy_slices_prologue, args, [None] * 3)

    def call_copy_slices_epilogue(self, needs_input_grad: Sequence[bool], result: torch.Tensor,
                                  res: Sequence[Any], grad_slice: torch.Tensor) -> list:
        return self.tracer.record_call(copy_slices_epilogue,
                                       (needs_input_grad, result, res, grad_slice),
                                       [None] * len(needs_input_grad))

    def proxy_call_backward(self, inputs: Sequence[Any], output_metadatas: Sequence[Any],
                            saved_tensors: Sequence[torch.Tensor], backward_idx: int,
                            ctx: Any, maybe_backward_state_idx: int | None = None,
                            opaque_object_indices: Sequence[int] = ()) -> tuple:
        """A Python ``autograd.Function`` backward: called, or pasted in for AOTAutograd."""
        tracer = self.tracer
        pctx = tracer.hook_proxy(backward_idx)
        pinputs = tracer.to_proxy(inputs)
        psaved = tracer.to_proxy(saved_tensors)
        if is_aot_backward(ctx._forward_cls):
            proxies = self.aot_backwards.paste(pinputs, psaved, ctx, maybe_backward_state_idx,
                                               opaque_object_indices)
        else:
            if getattr(ctx._forward_cls, "boxed_grads_call", False):
                raise RuntimeError(f"{ctx._forward_cls.__name__} sets boxed_grads_call=True, "
                                   "which compiled autograd does not support")
            proxies = tracer.record(call_backward, (pctx, psaved, *pinputs))
        with disable_proxy_modes_tracing():
            grad_ins: list[torch.Tensor | None] = []
            for index, meta in enumerate(output_metadatas):
                if meta is None or proxies[index] is None:
                    grad_ins.append(None)
                    continue
                layout, device, dtype, size = meta
                grad_ins.append(torch.empty(size=size, dtype=dtype, layout=layout,
                                            device=device))
            tracer.bind(grad_ins, proxies)
        return tuple(grad_ins)

    def accumulate(self, old_var: torch.Tensor, new_var: torch.Tensor) -> torch.Tensor:
        proxy_out = self.tracer.record(
            torch.add, (self.tracer.to_proxy(old_var), self.tracer.to_proxy(new_var)))
        result = placeholder_tensor()
        self.tracer.bind([result], [proxy_out])
        return result

    def accumulate_grad(self, *engine_args: Any) -> torch.Tensor | None:
        """``.grad`` accumulation; its arguments and reply differ by release (see
        :meth:`compiled_autograd.protocol.Protocol.unpack_accumulate_grad`)."""
        call = self.protocol.unpack_accumulate_grad(engine_args)
        to_proxy = self.tracer.to_proxy
        args: tuple[Any, ...] = (to_proxy(call.variable), to_proxy(call.variable_grad),
                                 to_proxy(call.grad), call.has_post_hooks)
        if call.read_current_grad_at_run_time:
            args = (*args, True)
        # Resolve (maybe adopt from torch) now: the graph's lookup must be a plain dict hit.
        functional_ops.get("AccumulateGrad")
        proxy_out = self.tracer.record(call_accumulate_grad, args)
        with disable_proxy_modes_tracing():
            result = torch.empty_like(call.variable)
        self.tracer.bind([result], [proxy_out])
        call.variable.grad = result
        return self.protocol.accumulate_grad_reply(result)

    # ---- hooks (recorded by compiled_autograd.hooks) ------------------------------------------

    def unpack_hook(self, hook_id: int, data_id: int) -> torch.Tensor:
        return hooks.record_unpack_hook(self.tracer, hook_id, data_id)

    def tensor_pre_hook(self, inputs: list[torch.Tensor], hook_id: int, i: int) -> list:
        return hooks.record_tensor_pre_hook(self.tracer, inputs, hook_id, i)

    def cpp_tensor_pre_hook(self, inputs: list[torch.Tensor], hook_id: int, i: int) -> list:
        return hooks.record_cpp_tensor_pre_hook(self.tracer, inputs, hook_id, i)

    def pre_hook(self, inputs: Sequence[Any], hook_id: int) -> list:
        return hooks.record_pre_hook(self.tracer, inputs, hook_id)

    def post_hook(self, outputs: list[Any], inputs: Sequence[Any], hook_id: int) -> list:
        return hooks.record_post_hook(self.tracer, outputs, inputs, hook_id)

    def post_acc_grad_hook(self, input: torch.Tensor, hook_id: int) -> list:
        return hooks.record_post_acc_grad_hook(self.tracer, input, hook_id)

    def bind_backward_state(self, index: int) -> BackwardState:
        return hooks.bind_backward_state(self.tracer, index)


def _hide_from_dynamo(cls: type) -> type:
    """The engine calls these methods from inside a backward that may itself run within a
    ``torch.compile``'d frame (e.g. ``loss.backward()`` in a compiled train step). Dynamo skips
    torch's own files, but would try to compile ours: opt every method out explicitly (what
    they call runs with Dynamo off too)."""
    for name, member in list(vars(cls).items()):
        if inspect.isfunction(member) and (name == "__init__" or not name.startswith("__")):
            setattr(cls, name, torch._dynamo.disable(member))
    return cls


_hide_from_dynamo(AutogradCompilerInstance)
