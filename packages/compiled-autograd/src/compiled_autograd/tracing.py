"""Recording a backward into one FX graph: fake values that stand for graph nodes.

While the engine walks the autograd graph, every value it hands us or gets back is a fake tensor
(or a symbolic int/float) tied to the FX node that computes the real one at run time.
:class:`BackwardTracer` owns that machinery: the fake-tensor and proxy modes, the graph's five
placeholders, lifting the engine's inputs, sizes and scalars into fakes and symbols, and
recording calls. The other capture modules record through it and never touch the modes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._dynamo.source import GetItemSource, LocalSource
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    PythonKeyTracer,
    disable_autocast_cache,
    disable_proxy_modes_tracing,
    fetch_object_proxy,
    track_tensor_tree,
)
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, _suppress_guards
from torch.fx.traceback import preserve_node_meta

from compiled_autograd.graph_ops import unwrap_maybe_dynamic_int
from compiled_autograd.passes import PLACEHOLDERS

# The engine's origin of each value: (NodeCall index, autograd node name).
Origins = Sequence[tuple[int, str]]
SetOrigin = Callable[[str, int], None]


def proxy_item(proxy: torch.fx.Proxy, index: int) -> torch.fx.Proxy:
    """``proxy[index]``: records an ``operator.getitem`` node."""
    # torch.fx.Proxy gets __getitem__ at import time (a setattr loop over fx's magic methods),
    # so torch's annotations do not declare it.
    return proxy[index]  # type: ignore[index]


def placeholder_tensor() -> torch.Tensor:
    """A stand-in result whose real shape only the run-time graph knows."""
    with disable_proxy_modes_tracing():
        return torch.zeros([0, 123456789])


class BackwardTracer:
    """The FX graph of one capture, and the fake values bound to its nodes."""

    def __init__(self) -> None:
        self.shape_env = ShapeEnv()
        self.fake_tensor_mode = FakeTensorMode(allow_fallback_kernels=True,
                                               allow_non_fake_inputs=True,
                                               shape_env=self.shape_env)
        self.fx_tracer = PythonKeyTracer()
        self.proxy_mode = ProxyTorchDispatchMode(self.fx_tracer, "symbolic")
        self.hooks_proxy: torch.fx.Proxy | None = None
        self.set_origin: SetOrigin | None = None
        self.symnode_proxies: dict[Any, torch.fx.Proxy] = {}

    @property
    def root(self) -> torch.nn.Module:
        return self.fx_tracer.root

    @property
    def graph(self) -> torch.fx.Graph:
        return self.fx_tracer.graph

    # ---- starting a capture ----------------------------------------------------------------

    def start(self, stack: contextlib.ExitStack, inputs: list[torch.Tensor], sizes: list[int],
              scalars: list[int | float], origins: Sequence[Origins] = (),
              set_origin: SetOrigin | None = None) -> tuple[list, list, list]:
        """Create the placeholders, turn the engine's values into fakes and symbols bound to
        them (in place, as the engine expects), and enter the tracing modes on ``stack``.
        Returns the fake inputs, symbolic sizes and symbolic scalars.

        ``origins``: the engine's (inputs, sizes, scalars) origins, one ``(NodeCall index,
        node name)`` per value; ``set_origin(name, index)`` is called before each input's and
        scalar's graph node is made, as torch tags them (sizes keep the last input's tag)."""
        self.set_origin = set_origin
        inputs_origins, _, scalars_origins = (*origins, (), (), ())[:3]
        self.symnode_proxies = {}
        self.fx_tracer.root = torch.nn.Module()
        self.fx_tracer.graph = torch.fx.Graph(tracer_cls=PythonKeyTracer)
        self.fx_tracer.tensor_attrs = {}
        (inputs_proxy, sizes_proxy, self.scalars_proxy, self.hooks_proxy,
         self.packed_data_proxy) = (self.fx_tracer.create_proxy("placeholder", name, (), {})
                                    for name in PLACEHOLDERS)
        stack.enter_context(preserve_node_meta())
        # The python dispatcher marks "tracing" so nobody hashes a SymInt while we capture.
        stack.enter_context(enable_python_dispatcher())

        self._fake_inputs(inputs, inputs_proxy, inputs_origins)
        sym_sizes = self._symbolic_sizes(sizes, sizes_proxy)
        self._symbolic_scalars(scalars, scalars_origins)

        stack.enter_context(self.fake_tensor_mode)
        stack.enter_context(self.proxy_mode)
        stack.enter_context(disable_autocast_cache())
        # The graph must stay general in every size: never let a guard specialise a symbol.
        stack.enter_context(_suppress_guards(self.shape_env))
        return inputs, sym_sizes, scalars

    def _fake_inputs(self, inputs: list[torch.Tensor], inputs_proxy: torch.fx.Proxy,
                     origins: Origins) -> None:
        for index, tensor in enumerate(inputs):
            try:
                inputs[index] = self.fake_tensor_mode.from_tensor(
                    tensor, source=GetItemSource(LocalSource("inputs"), index))
            except Exception as error:
                raise NotImplementedError(
                    f"compiled autograd cannot fake backward input {index} of type "
                    f"{type(tensor).__name__}; run this backward outside "
                    "compiled_autograd.enable()") from error
        self.bind(inputs, inputs_proxy, origins)

    def _symbolic_sizes(self, sizes: list[int], sizes_proxy: torch.fx.Proxy) -> list[Any]:
        sym_sizes = [self.shape_env.create_unspecified_symint_and_symbol(
            value, GetItemSource(LocalSource("sizes"), index), DimDynamic.DYNAMIC)
            for index, value in enumerate(sizes)]
        size_proxies = [self.fx_tracer.create_proxy(
            "call_function", unwrap_maybe_dynamic_int, (proxy_item(sizes_proxy, i),), {})
            for i in range(len(sizes))]
        for symint, proxy in zip(sym_sizes, size_proxies):
            if isinstance(symint, torch.SymInt):
                self.symnode_proxies[symint.node] = proxy
        self.bind(sym_sizes, size_proxies)
        return sym_sizes

    def _symbolic_scalars(self, scalars: list[Any], origins: Origins) -> None:
        for index, value in enumerate(scalars):
            source = GetItemSource(LocalSource("scalars"), index)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RuntimeError(f"unexpected lifted scalar {value!r} of type "
                                   f"{type(value).__name__}; expected int or float")
            if isinstance(value, int):
                scalars[index] = self.shape_env.create_unspecified_symint_and_symbol(
                    value, source, DimDynamic.DYNAMIC)
            else:
                scalars[index] = self.shape_env.create_symfloatnode(
                    self.shape_env.create_unspecified_symbol(value, source=source,
                                                             dynamic_dim=DimDynamic.DYNAMIC),
                    hint=value, source=source)
        self.bind(scalars, self.scalars_proxy, origins)
        for index, symbolic in enumerate(scalars):
            if isinstance(symbolic, (torch.SymInt, torch.SymFloat)):
                self.symnode_proxies[symbolic.node] = proxy_item(self.scalars_proxy, index)

    # ---- binding values to graph nodes -----------------------------------------------------

    def to_proxy(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, list):
            return [self.to_proxy(x) for x in value]
        if isinstance(value, tuple):
            return tuple(self.to_proxy(x) for x in value)
        if isinstance(value, (torch.SymInt, torch.SymFloat)):
            return self.symnode_proxies[value.node]
        if not isinstance(value, torch.Tensor):
            return value  # constants: dtype, device, str, int
        tracked = fetch_object_proxy(self.fx_tracer, value)
        if isinstance(tracked, torch.Tensor):  # what fetch_object_proxy returns when untracked
            raise RuntimeError(f"a {type(value).__name__} reached the capture that no node of "
                               "the backward graph computes")
        return tracked.proxy

    def bind(self, objects: Sequence[Any], proxies: Any, origins: Origins = ()) -> Any:
        """Make each of ``objects`` stand for the matching proxy from now on. When ``proxies``
        is one proxy, each item's node is tagged with its entry of ``origins`` (if given)."""
        if isinstance(proxies, torch.fx.Proxy):
            whole, proxies = proxies, []
            for i in range(len(objects)):
                if origins and self.set_origin is not None:
                    nodecall_index, node_name = origins[i]
                    self.set_origin(node_name, nodecall_index)
                proxies.append(proxy_item(whole, i))
        if len(objects) != len(proxies):
            raise RuntimeError(f"binding {len(objects)} values to {len(proxies)} graph nodes")
        track_tensor_tree(objects, proxies, constant=None, tracer=self.fx_tracer)
        return proxies

    def hook_proxy(self, index: int) -> torch.fx.Proxy:
        """``hooks[index]``: the graph input carrying a hook, a ctx or a backward state."""
        if self.hooks_proxy is None:
            raise RuntimeError("the engine called a hook method before begin_capture")
        return proxy_item(self.hooks_proxy, index)

    # ---- recording calls -------------------------------------------------------------------

    def record(self, fn: Callable[..., Any], args: Any,
               kwargs: dict[str, Any] | None = None) -> torch.fx.Proxy:
        """A ``call_function`` node of ``fn``; ``args`` must already be proxies."""
        return self.fx_tracer.create_proxy("call_function", fn, args, kwargs or {})

    def record_call(self, fn: Callable[..., Any], args: Any,
                    output_metadata: Sequence[Any]) -> list[torch.Tensor]:
        """Record ``fn(*args)`` returning one tensor per ``output_metadata`` entry; returns
        stand-ins bound to its outputs."""
        proxy_out = self.record(fn, pytree.tree_map(self.to_proxy, args))
        result = [placeholder_tensor() for _ in output_metadata]
        self.bind(result, [proxy_item(proxy_out, i) for i in range(len(result))])
        return result

    def record_output(self, outputs: Any) -> torch.fx.Graph:
        """Close the graph with its output node; returns the graph."""
        self.fx_tracer.create_node("output", "output",
                                   (self.fx_tracer.create_arg(self.to_proxy(outputs)),), {})
        return self.fx_tracer.graph
