"""The compiler instance the C++ autograd engine drives while it captures one backward.

The engine walks the autograd graph itself; for every node it calls one of this class's methods
(see the table in :mod:`compiled_autograd.protocol`). We answer with fake tensors bound to FX
proxies, so by :meth:`AutogradCompilerInstance.end_capture` the whole backward (built-in nodes,
Python ``autograd.Function`` backwards, AOTAutograd backwards pasted in node by node, and every
hook) is one FX graph with the signature ``(inputs, sizes, scalars, hooks, packed_data)``.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._dynamo.source import GetItemSource, LocalSource
from torch._dynamo.utils import set_locals_to_steal
from torch._subclasses import FakeTensorMode
from torch.fx import GraphModule
from torch.fx.experimental._backward_state import BackwardState
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    PythonKeyTracer,
    disable_autocast_cache,
    disable_proxy_modes_tracing,
    fetch_object_proxy,
    track_tensor_tree,
)
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, _suppress_guards
from torch.fx.traceback import preserve_node_meta, set_stack_trace

from compiled_autograd import passes, protocol
from compiled_autograd.graph_ops import (
    call_accumulate_grad,
    call_backward,
    call_hook,
    copy_slices_epilogue,
    copy_slices_prologue,
    end_of_backward,
    unwrap_maybe_dynamic_int,
)
from compiled_autograd.interop import enter_torch_region, functional_ops, leave_torch_region
from compiled_autograd.state import STATE, CompilerFactory

logger = logging.getLogger(__name__)
graph_logger = logging.getLogger("compiled_autograd.graph")

_capture_ids = itertools.count()


class ForeignCompilerError(RuntimeError):
    """A graph we captured was about to run under a compiler that is not ours."""


class CompilerFnError(RuntimeError):
    """``compiler_fn`` raised while compiling a captured backward graph."""


def _clone(x: torch.Tensor | None) -> torch.Tensor | None:
    # Hooks may return their input; a clone gives the proxy a tensor of its own to bind to.
    return None if x is None else torch._prims_common.clone_preserve_strides(x)


def _dummy() -> torch.Tensor:
    """A placeholder result whose real shape only the run-time graph knows."""
    with disable_proxy_modes_tracing():
        return torch.zeros([0, 123456789])


def call_compiler_fn(compiler_fn: Callable[..., Any], graph: GraphModule) -> Any:
    """``compiler_fn(graph)``, or ``compiler_fn(graph, [])`` for AOT-style two-argument compilers
    (e.g. ``aot_compilers.nop``): a backward graph has no example inputs to offer. A boxed
    result (``_boxed_call = True``) is called with one list of the five graph arguments."""
    try:
        params = inspect.signature(compiler_fn).parameters.values()
        required = [p for p in params if p.default is inspect.Parameter.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        required = []
    compiled = compiler_fn(graph, []) if len(required) >= 2 else compiler_fn(graph)
    if getattr(compiled, "_boxed_call", False):
        # AOT "boxed" convention: one list of arguments instead of five positional ones
        return lambda *args: compiled(list(args))
    return compiled


class AutogradCompilerInstance:
    """One capture: created by the engine on a cache miss, driven by it, then discarded."""

    def __init__(self, compiler_fn: Callable[..., Any]) -> None:
        self.compiler_fn = compiler_fn
        self.protocol = protocol.current()
        self.stack = contextlib.ExitStack()
        self.shape_env = ShapeEnv()
        self.fake_tensor_mode = FakeTensorMode(allow_fallback_kernels=True,
                                               allow_non_fake_inputs=True,
                                               shape_env=self.shape_env)
        self.fx_tracer = PythonKeyTracer()
        self.proxy_mode = ProxyTorchDispatchMode(self.fx_tracer, "symbolic")
        self.hooks_proxy: torch.fx.Proxy | None = None
        self.id = -1

    def close(self) -> None:
        self.stack.close()

    # ---- binding values to graph nodes ---------------------------------------------------

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
        return fetch_object_proxy(self.fx_tracer, value).proxy

    def bind(self, objects: Sequence[Any], proxies: Any) -> Any:
        """Make each of ``objects`` stand for the matching proxy from now on."""
        if isinstance(proxies, torch.fx.Proxy):
            proxies = [proxies[i] for i in range(len(objects))]
        if len(objects) != len(proxies):
            raise RuntimeError(f"binding {len(objects)} values to {len(proxies)} graph nodes")
        track_tensor_tree(objects, proxies, constant=None, tracer=self.fx_tracer)
        return proxies

    def _hook_proxy(self, index: int) -> torch.fx.Proxy:
        if self.hooks_proxy is None:
            raise RuntimeError("the engine called a hook method before begin_capture")
        return self.hooks_proxy[index]

    # ---- the protocol ----------------------------------------------------------------------

    def begin_capture(self, inputs: list[torch.Tensor], sizes: list[int],
                      scalars: list[int | float], origins: list[list[tuple[int, str]]],
                      accumulate_grad: bool, check_nans: bool) -> tuple[str, list, list, list]:
        STATE.captures += 1
        self.id = next(_capture_ids)
        self.check_nans = check_nans
        self.aot_paste_counts: dict[int, int] = defaultdict(int)
        self.symnode_proxies: dict[Any, torch.fx.Proxy] = {}
        self.fx_tracer.root = torch.nn.Module()
        self.fx_tracer.graph = torch.fx.Graph(tracer_cls=PythonKeyTracer)
        self.fx_tracer.tensor_attrs = {}
        (inputs_proxy, sizes_proxy, self.scalars_proxy, self.hooks_proxy,
         self.packed_data_proxy) = (self.fx_tracer.create_proxy("placeholder", name, (), {})
                                    for name in passes.PLACEHOLDERS)
        self.stack.enter_context(preserve_node_meta())
        # The python dispatcher marks "tracing" so nobody hashes a SymInt while we capture.
        self.stack.enter_context(enable_python_dispatcher())

        for index, tensor in enumerate(inputs):
            try:
                inputs[index] = self.fake_tensor_mode.from_tensor(
                    tensor, source=GetItemSource(LocalSource("inputs"), index))
            except Exception as error:
                raise NotImplementedError(
                    f"compiled autograd cannot fake backward input {index} of type "
                    f"{type(tensor).__name__}; run this backward outside "
                    "compiled_autograd.enable()") from error
        self.bind(inputs, inputs_proxy)

        sym_sizes = [self.shape_env.create_unspecified_symint_and_symbol(
            value, GetItemSource(LocalSource("sizes"), index), DimDynamic.DYNAMIC)
            for index, value in enumerate(sizes)]
        size_proxies = [self.fx_tracer.create_proxy(
            "call_function", unwrap_maybe_dynamic_int, (sizes_proxy[i],), {})
            for i in range(len(sizes))]
        for symint, proxy in zip(sym_sizes, size_proxies):
            if isinstance(symint, torch.SymInt):
                self.symnode_proxies[symint.node] = proxy
        self.bind(sym_sizes, size_proxies)

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
        self.bind(scalars, self.scalars_proxy)
        for index, symbolic in enumerate(scalars):
            if isinstance(symbolic, (torch.SymInt, torch.SymFloat)):
                self.symnode_proxies[symbolic.node] = self.scalars_proxy[index]

        self.stack.enter_context(self.fake_tensor_mode)
        self.stack.enter_context(self.proxy_mode)
        self.stack.enter_context(disable_autocast_cache())
        # The graph must stay general in every size: never let a guard specialise a symbol.
        self.stack.enter_context(_suppress_guards(self.shape_env))
        return f"compiled_autograd.capture{self.id}", inputs, sym_sizes, scalars

    def log_compile_reasons(self, compile_reasons: list[str]) -> None:
        logger.info("capture %d: cache miss because %s", self.id, "; ".join(compile_reasons))

    def set_node_origin(self, node_name: str, nodecall_index: int, pyobj: Any = None) -> None:
        """Tag the nodes recorded next with the autograd node they came from."""
        aot_id = ""
        forward_cls = getattr(pyobj, "_forward_cls", None)
        if forward_cls is not None and hasattr(forward_cls, "_aot_id"):
            aot_id = str(forward_cls._aot_id)
        set_stack_trace([f"  {node_name}{aot_id} (NodeCall {nodecall_index})\n"])

    def bind_function(self, fn_name: str, fn: Callable[..., Any], is_custom_function: bool,
                      is_traceable: bool) -> str:
        return functional_ops.add(fn_name, fn, is_custom_function, is_traceable)

    def proxy_call(self, fn: Callable[..., Any], args: Any,
                   output_metadata: Sequence[Any]) -> list[torch.Tensor]:
        proxy_args = pytree.tree_map(self.to_proxy, args)
        proxy_out = self.fx_tracer.create_proxy("call_function", fn, args=proxy_args, kwargs={})
        result = [_dummy() for _ in output_metadata]
        self.bind(result, [proxy_out[i] for i in range(len(result))])
        return result

    def apply_functional(self, fn_name: str, grads: Sequence[Any], args: Any,
                         output_metadata: Sequence[Any]) -> list[torch.Tensor]:
        return self.proxy_call(functional_ops.get(fn_name), (grads, *args), output_metadata)

    def validate_outputs(self, fn_name: str, outputs: Sequence[Any], args: Any,
                         output_metadata: Sequence[Any]) -> Sequence[Any]:
        proxy_args = pytree.tree_map(self.to_proxy, (outputs, *args))
        proxies = self.fx_tracer.create_proxy("call_function", functional_ops.get(fn_name),
                                              args=proxy_args, kwargs={})
        self.bind(outputs, proxies)
        return outputs

    def call_copy_slices_prologue(self, inputs: Sequence[Any], base_sizes: Sequence[Any],
                                  base_strides: Sequence[Any], base_storage_offset: Any,
                                  view_sizes: Sequence[Any], view_strides: Sequence[Any],
                                  view_storage_offset: Any) -> list[torch.Tensor]:
        args = (inputs, base_sizes, base_strides, base_storage_offset, view_sizes,
                view_strides, view_storage_offset)
        return self.proxy_call(copy_slices_prologue, args, [None] * 3)

    def call_copy_slices_epilogue(self, needs_input_grad: Sequence[bool], result: torch.Tensor,
                                  res: Sequence[Any], grad_slice: torch.Tensor) -> list:
        return self.proxy_call(copy_slices_epilogue, (needs_input_grad, result, res, grad_slice),
                               [None] * len(needs_input_grad))

    def proxy_call_backward(self, inputs: Sequence[Any], output_metadatas: Sequence[Any],
                            saved_tensors: Sequence[torch.Tensor], backward_idx: int,
                            ctx: Any, maybe_backward_state_idx: int | None = None,
                            opaque_object_indices: Sequence[int] = ()) -> tuple:
        """A Python ``autograd.Function`` backward: called, or pasted in for AOTAutograd."""
        pctx = self._hook_proxy(backward_idx)
        pinputs = self.to_proxy(inputs)
        psaved = self.to_proxy(saved_tensors)
        if hasattr(ctx._forward_cls, "_aot_id"):
            proxies = self._paste_aot_backward(pinputs, psaved, ctx, maybe_backward_state_idx,
                                               opaque_object_indices)
        else:
            if getattr(ctx._forward_cls, "boxed_grads_call", False):
                raise RuntimeError(f"{ctx._forward_cls.__name__} sets boxed_grads_call=True, "
                                   "which compiled autograd does not support")
            proxies = self.fx_tracer.create_proxy(
                "call_function", call_backward, args=(pctx, psaved, *pinputs), kwargs={})
        with disable_proxy_modes_tracing():
            grad_ins: list[torch.Tensor | None] = []
            for index, meta in enumerate(output_metadatas):
                if meta is None or proxies[index] is None:
                    grad_ins.append(None)
                    continue
                layout, device, dtype, size = meta
                grad_ins.append(torch.empty(size=size, dtype=dtype, layout=layout,
                                            device=device))
            self.bind(grad_ins, proxies)
        return tuple(grad_ins)

    def _paste_aot_backward(self, pinputs: Sequence[Any], psaved: Sequence[Any], ctx: Any,
                            backward_state_idx: int | None,
                            opaque_object_indices: Sequence[int]) -> Any:
        """Copy the AOTAutograd backward graph node by node between its prologue/epilogue.

        Pasting (rather than calling the compiled backward) lets the passes and the next
        compiler see, fuse and reorder across the whole backward.
        """
        compiled_function = ctx._forward_cls
        bw_module = protocol.aot_backward_module(compiled_function)
        prologue = protocol.aot_backward_prologue(compiled_function)
        epilogue = protocol.aot_backward_epilogue(compiled_function)
        aot_id = compiled_function._aot_id
        if torch.is_grad_enabled() and any(
                info.requires_grad for info in compiled_function.metadata.output_info):
            raise RuntimeError("compiled autograd does not support higher-order gradients "
                               "through a torch.compile'd forward (create_graph=True)")

        symints = ctx._get_compiled_autograd_symints()
        psymints = [self.to_proxy(s) for s in symints]
        popaque = [self._hook_proxy(i) for i in opaque_object_indices]

        @torch._dynamo.allow_in_graph
        def aot_backward_prologue(saved: Any, syms: Any, opaque: Any, grads: Any) -> Any:
            # Fresh lists: under Dynamo these arrive as FX immutable_lists, and the prologue
            # edits its argument lists in place.
            return prologue(list(saved), list(syms), list(opaque), list(grads))

        pgrads = self.fx_tracer.create_proxy(
            "call_function", aot_backward_prologue,
            args=(psaved, psymints, popaque, list(pinputs)), kwargs={})
        pstate = None if backward_state_idx is None else self._hook_proxy(backward_state_idx)

        placeholders = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
        # bw_module's calling convention: [*symints, *saved and grads, backward_state?]
        pargs = [pgrads[i] for i in range(len(placeholders) - int(pstate is not None))]
        pargs[: len(symints)] = psymints
        if pstate is not None:
            pargs.append(pstate)

        paste = self.aot_paste_counts[aot_id]
        self.aot_paste_counts[aot_id] += 1
        prefix = f"aot{aot_id}" + (f"_{paste}" if paste else "") + "_"
        remap: dict[torch.fx.Node, torch.fx.Node] = {}
        root, graph = self.fx_tracer.root, self.fx_tracer.graph
        poutputs: list[Any] | None = None
        arg_iter = iter(pargs)
        for node in bw_module.graph.nodes:
            if node.op == "placeholder":
                pasted = next(arg_iter).node
                pasted.name = prefix + node.name
                remap[node] = pasted
            elif node.op == "output":
                poutputs = [torch.fx.Proxy(remap[n], self.fx_tracer)
                            if isinstance(n, torch.fx.Node) else n for n in node.args[0]]
            elif node.op in ("get_attr", "call_module"):
                qualname = self.fx_tracer.get_fresh_qualname(node.target)
                setattr(root, qualname, getattr(bw_module, node.target))
                pasted = graph.node_copy(node, lambda n: remap[n])
                pasted.target = qualname
                pasted.name = prefix + node.name
                remap[node] = pasted
            elif node.op == "call_function":
                if node.target is torch.ops.aten.view.default:
                    # the forward got view->reshape already; a lazily compiled backward did not
                    node.target = torch.ops.aten.reshape.default
                pasted = graph.node_copy(node, lambda n: remap[n])
                pasted.name = prefix + node.name
                remap[node] = pasted
            else:
                raise RuntimeError(f"cannot paste AOT backward node {node.format_node()}")
        if poutputs is None:
            raise RuntimeError(f"AOT backward {aot_id} has no output node")
        with disable_proxy_modes_tracing():
            outputs = [torch.zeros(0, 0, 0, 0, 123) if isinstance(o, torch.fx.Proxy) else o
                       for o in poutputs]
        self.bind(outputs, poutputs)

        def proxy_subclass_constructor(subclass_meta: Any, is_runtime: bool,
                                       unwrapped_args: Sequence[Any]) -> torch.Tensor:
            @torch._dynamo.allow_in_graph
            def make_subclass(*args: Any) -> Any:
                return subclass_meta.creation_fn(args, is_runtime=is_runtime)

            poutput = self.fx_tracer.create_proxy(
                "call_function", make_subclass,
                args=tuple(pytree.tree_map(self.to_proxy, unwrapped_args)), kwargs={})
            output = _dummy()
            self.bind([output], [poutput])
            return output

        results = epilogue(outputs, make_subclass_override=proxy_subclass_constructor)
        return pytree.tree_map(self.to_proxy, results)

    def accumulate(self, old_var: torch.Tensor, new_var: torch.Tensor) -> torch.Tensor:
        proxy_out = self.fx_tracer.create_proxy(
            "call_function", torch.add, args=(self.to_proxy(old_var), self.to_proxy(new_var)),
            kwargs={})
        result = _dummy()
        self.bind([result], [proxy_out])
        return result

    def accumulate_grad(self, variable: torch.Tensor, *rest: Any) -> torch.Tensor | None:
        """2.11 passes ``(grad, has_post_hooks)``; 2.13+ ``(variable_grad, grad, has_post_hooks)``."""
        if len(rest) == 2:
            grad, has_post_hooks = rest
            args = (self.to_proxy(variable), None, self.to_proxy(grad), has_post_hooks, True)
        elif len(rest) == 3:
            variable_grad, grad, has_post_hooks = rest
            args = (self.to_proxy(variable), self.to_proxy(variable_grad), self.to_proxy(grad),
                    has_post_hooks)
        else:
            raise RuntimeError(f"accumulate_grad got {1 + len(rest)} arguments; torch "
                               f"{torch.__version__} is not speaking a known protocol")
        # Resolve (maybe adopt from torch) now: the graph's lookup must be a plain dict hit.
        functional_ops.get("AccumulateGrad")
        proxy_out = self.fx_tracer.create_proxy("call_function", call_accumulate_grad,
                                                args=args, kwargs={})
        with disable_proxy_modes_tracing():
            result = torch.empty_like(variable)
        self.bind([result], [proxy_out])
        variable.grad = result
        return None if len(rest) == 2 else result

    def _call_hook(self, hook_id: int, hook_type: str, *args: Any) -> torch.fx.Proxy:
        return self.fx_tracer.create_proxy(
            "call_function", call_hook,
            (self._hook_proxy(hook_id), *[self.to_proxy(a) for a in args]),
            {"hook_type": hook_type})

    def unpack_hook(self, hook_id: int, data_id: int) -> torch.Tensor:
        proxy = self.fx_tracer.create_proxy(
            "call_function", call_hook,
            (self._hook_proxy(hook_id), self.packed_data_proxy[data_id]),
            {"hook_type": "unpack_hook"})
        out = _dummy()
        self.bind([out], [proxy])
        return out

    def tensor_pre_hook(self, inputs: list[torch.Tensor], hook_id: int, i: int) -> list:
        proxy = self._call_hook(hook_id, "tensor_pre_hook", inputs[i])
        with disable_proxy_modes_tracing():
            inputs[i] = _clone(inputs[i])
            self.bind([inputs[i]], [proxy])
        return inputs

    def cpp_tensor_pre_hook(self, inputs: list[torch.Tensor], hook_id: int, i: int) -> list:
        proxy = self.fx_tracer.create_proxy(
            "call_function", protocol.call_cpp_tensor_pre_hooks,
            (hook_id, self.to_proxy(inputs[i])), {})
        with disable_proxy_modes_tracing():
            inputs[i] = _clone(inputs[i])
            self.bind([inputs[i]], [proxy])
        return inputs

    def pre_hook(self, inputs: Sequence[Any], hook_id: int) -> list:
        proxies = self._call_hook(hook_id, "pre_hook", inputs)
        with disable_proxy_modes_tracing():
            inputs = [_clone(x) for x in inputs]
            self.bind(inputs, proxies)
        return inputs

    def post_hook(self, outputs: list[Any], inputs: Sequence[Any], hook_id: int) -> list:
        proxies = self._call_hook(hook_id, "post_hook", outputs, inputs)
        with disable_proxy_modes_tracing():
            outputs = [_clone(x) for x in outputs]
            self.bind(outputs, proxies)
        return outputs

    def post_acc_grad_hook(self, input: torch.Tensor, hook_id: int) -> list:
        proxy = self._call_hook(hook_id, "post_acc_grad_hook", input)
        with disable_proxy_modes_tracing():
            result = [_clone(input)]
            self.bind(result, [proxy])
        return result

    def bind_backward_state(self, index: int) -> BackwardState:
        state = BackwardState()
        track_tensor_tree(state, self._hook_proxy(index), constant=None, tracer=self.fx_tracer)
        return state

    def end_capture(self, outputs: Any) -> tuple[Callable[..., Any], Any]:
        self.fx_tracer.create_proxy("call_function", end_of_backward, (), {})
        self.stack.close()
        self.fx_tracer.create_node("output", "output",
                                   (self.fx_tracer.create_arg(self.to_proxy(outputs)),), {})
        graph = self.fx_tracer.graph
        to_cuda = passes.move_cpu_scalars_to_cuda(graph) if STATE.cpu_scalars_to_cuda() else []
        passes.strip_fake_metadata(graph)
        passes.run_all(graph)
        used_sizes = passes.remove_unused_sizes(graph)
        module = GraphModule(self.fx_tracer.root, graph, f"CompiledAutograd{self.id}")
        # Dynamo then keeps ``inputs`` as ONE list argument and clears it once unpacked, so
        # each saved activation is freed as soon as the compiled graph is done with it.
        set_locals_to_steal(module, ["inputs"])
        if graph_logger.isEnabledFor(logging.INFO):  # printing a big graph is not free
            graph_logger.info("compiled autograd graph %d:\n%s", self.id,
                              module.print_readable(print_output=False))
        compiled_fn = self._compile(module)
        runtime_wrapper = _make_runtime_wrapper(used_sizes, to_cuda, self.check_nans)
        return runtime_wrapper, compiled_fn

    def _compile(self, module: GraphModule) -> Any:
        STATE.compiles += 1
        try:
            return call_compiler_fn(self.compiler_fn, module)
        except Exception as error:
            name = getattr(self.compiler_fn, "__name__", type(self.compiler_fn).__name__)
            calls = sum(1 for n in module.graph.nodes if n.op == "call_function")
            raise CompilerFnError(
                f"compiler_fn {name!r} failed on compiled-autograd graph {module._get_name()} "
                f"({calls} calls): {type(error).__name__}: {error}") from error


def _hide_from_dynamo(cls: type) -> type:
    """The engine calls these methods from inside a backward that may itself run within a
    ``torch.compile``'d frame (e.g. ``loss.backward()`` in a compiled train step). Dynamo skips
    torch's own files, but would try to compile ours: opt every method out explicitly."""
    for name, member in list(vars(cls).items()):
        if inspect.isfunction(member) and (name == "__init__" or not name.startswith("__")):
            setattr(cls, name, torch._dynamo.disable(member))
    return cls


_hide_from_dynamo(AutogradCompilerInstance)


def _make_runtime_wrapper(used_sizes: list[int], to_cuda: list[int],
                          check_nans: bool) -> Callable[..., Any]:
    mark_dynamic = torch._dynamo.maybe_mark_dynamic

    def runtime_wrapper(compiled_fn: Callable[..., Any], inputs: list[Any], sizes: list[int],
                        scalars: list[Any], hooks: list[Any], packed_inputs: list[Any]) -> Any:
        STATE.runs += 1
        filtered: list[Any] = []
        for index in used_sizes:
            size = sizes[index]
            if size > 0:  # torch.empty(0, n) carries n as a (possibly dynamic) dimension
                holder = torch.empty(0, size)
                mark_dynamic(holder, 1)
                filtered.append(holder)
            else:
                filtered.append(size)
        for index in to_cuda:
            inputs[index] = inputs[index].pin_memory().cuda(non_blocking=True)
        # The compiled graph must not re-enter compiled autograd (e.g. Dynamo compiling it).
        installed, installed_dynamic = protocol.set_compiler(None, False)
        STATE.in_compiled_region = True
        region = enter_torch_region()
        try:
            if not isinstance(installed, CompilerFactory):
                raise ForeignCompilerError(
                    "the autograd engine's cache returned a graph captured by "
                    "compiled_autograd, but another compiled autograd (torch's own?) is "
                    f"installed now ({installed!r}); the engine's cache ignores which compiler "
                    "filled it. Call compiled_autograd.reset() before switching.")
            out = compiled_fn(inputs, filtered, scalars, hooks, packed_inputs)
        finally:
            leave_torch_region(region)
            STATE.in_compiled_region = False
            protocol.set_compiler(installed, installed_dynamic)
        if check_nans:
            _check_nans(out)
        return out

    return torch._dynamo.disable(runtime_wrapper)


def _check_nans(out: Any) -> None:
    bad = [i for i, t in enumerate(out or ()) if isinstance(t, torch.Tensor) and t.isnan().any()]
    if bad:
        raise RuntimeError(f"compiled autograd returned NaN gradients for outputs {bad} "
                           "(anomaly mode)")

