"""Recording the hooks of a backward: each one a ``call_hook`` node in the captured graph.

The engine hands over hooks by index into the graph's ``hooks`` input (the real hook objects
only arrive at run time). Every hook is recorded as a node, and the values it returns are fresh
stand-ins bound to that node, so later nodes read the hook's result rather than its input.
Where in the graph the hooks end up is :mod:`compiled_autograd.passes`' business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, track_tensor_tree

from compiled_autograd import protocol
from compiled_autograd.graph_ops import call_hook
from compiled_autograd.tracing import BackwardTracer, placeholder_tensor, proxy_item


@overload
def _clone(x: torch.Tensor) -> torch.Tensor: ...
@overload
def _clone(x: torch.Tensor | None) -> torch.Tensor | None: ...
def _clone(x: torch.Tensor | None) -> torch.Tensor | None:
    # Hooks may return their input; a clone gives the proxy a tensor of its own to bind to.
    return None if x is None else torch._prims_common.clone_preserve_strides(x)


def _record_hook(tracer: BackwardTracer, hook_id: int, hook_type: str,
                 *args: Any) -> torch.fx.Proxy:
    return tracer.record(call_hook, (tracer.hook_proxy(hook_id),
                                     *[tracer.to_proxy(a) for a in args]),
                         {"hook_type": hook_type})


def record_unpack_hook(tracer: BackwardTracer, hook_id: int, data_id: int) -> torch.Tensor:
    """A saved-tensor unpack hook, applied to ``packed_data[data_id]``."""
    proxy = tracer.record(call_hook, (tracer.hook_proxy(hook_id),
                                      proxy_item(tracer.packed_data_proxy, data_id)),
                          {"hook_type": "unpack_hook"})
    out = placeholder_tensor()
    tracer.bind([out], [proxy])
    return out


def record_tensor_pre_hook(tracer: BackwardTracer, inputs: list[torch.Tensor], hook_id: int,
                           i: int) -> list:
    proxy = _record_hook(tracer, hook_id, "tensor_pre_hook", inputs[i])
    with disable_proxy_modes_tracing():
        inputs[i] = _clone(inputs[i])
        tracer.bind([inputs[i]], [proxy])
    return inputs


def record_cpp_tensor_pre_hook(tracer: BackwardTracer, inputs: list[torch.Tensor],
                               hook_id: int, i: int) -> list:
    """A tensor hook registered from C++: the graph calls back into the engine to run it."""
    proxy = tracer.record(protocol.call_cpp_tensor_pre_hooks,
                          (hook_id, tracer.to_proxy(inputs[i])))
    with disable_proxy_modes_tracing():
        inputs[i] = _clone(inputs[i])
        tracer.bind([inputs[i]], [proxy])
    return inputs


def record_pre_hook(tracer: BackwardTracer, inputs: Sequence[Any], hook_id: int) -> list:
    proxies = _record_hook(tracer, hook_id, "pre_hook", inputs)
    with disable_proxy_modes_tracing():
        inputs = [_clone(x) for x in inputs]
        tracer.bind(inputs, proxies)
    return inputs


def record_post_hook(tracer: BackwardTracer, outputs: list[Any], inputs: Sequence[Any],
                     hook_id: int) -> list:
    proxies = _record_hook(tracer, hook_id, "post_hook", outputs, inputs)
    with disable_proxy_modes_tracing():
        outputs = [_clone(x) for x in outputs]
        tracer.bind(outputs, proxies)
    return outputs


def record_post_acc_grad_hook(tracer: BackwardTracer, input: torch.Tensor,
                              hook_id: int) -> list:
    proxy = _record_hook(tracer, hook_id, "post_acc_grad_hook", input)
    with disable_proxy_modes_tracing():
        result = [_clone(input)]
        tracer.bind(result, [proxy])
    return result


def bind_backward_state(tracer: BackwardTracer, index: int) -> BackwardState:
    """The ``BackwardState`` of a compiled forward, carried in ``hooks[index]``."""
    state = BackwardState()
    track_tensor_tree(state, tracer.hook_proxy(index), constant=None, tracer=tracer.fx_tracer)
    return state
