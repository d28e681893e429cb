"""Pasting the backward of a ``torch.compile``'d forward into the captured graph.

An AOTAutograd ``CompiledFunction`` reaches the engine as one Python autograd node. Calling its
compiled backward would leave an opaque block in our graph; instead its backward FX graph is
copied in node by node, between the prologue and epilogue AOTAutograd wraps around it, so the
passes and the next compiler see, fuse and reorder across the whole backward. How each release
exposes the graph, prologue and epilogue is :mod:`compiled_autograd.protocol`'s business.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

from compiled_autograd import protocol
from compiled_autograd.tracing import BackwardTracer, placeholder_tensor, proxy_item


def is_aot_backward(forward_cls: Any) -> bool:
    """Whether an autograd Function class is an AOTAutograd ``CompiledFunction``."""
    return hasattr(forward_cls, "_aot_id")


class AotBackwardPaster:
    """Pastes AOT backwards into one capture; a forward run twice is pasted twice, with a
    numbered prefix so node names stay unique."""

    def __init__(self, tracer: BackwardTracer) -> None:
        self.tracer = tracer
        self.paste_counts: dict[int, int] = defaultdict(int)

    def paste(self, pinputs: Sequence[Any], psaved: Sequence[Any], ctx: Any,
              backward_state_idx: int | None, opaque_object_indices: Sequence[int]) -> Any:
        """Copy the AOTAutograd backward graph node by node between its prologue/epilogue;
        returns the proxies of the gradients it produces."""
        tracer = self.tracer
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
        psymints = [tracer.to_proxy(s) for s in symints]
        popaque = [tracer.hook_proxy(i) for i in opaque_object_indices]

        @torch._dynamo.allow_in_graph
        def aot_backward_prologue(saved: Any, syms: Any, opaque: Any, grads: Any) -> Any:
            # Fresh lists: under Dynamo these arrive as FX immutable_lists, and the prologue
            # edits its argument lists in place.
            return prologue(list(saved), list(syms), list(opaque), list(grads))

        pgrads = tracer.record(aot_backward_prologue,
                               (psaved, psymints, popaque, list(pinputs)))
        pstate = None if backward_state_idx is None else tracer.hook_proxy(backward_state_idx)

        placeholders = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
        # bw_module's calling convention: [*symints, *saved and grads, backward_state?]
        pargs = [proxy_item(pgrads, i) for i in range(len(placeholders) - int(pstate is not None))]
        pargs[: len(symints)] = psymints
        if pstate is not None:
            pargs.append(pstate)

        poutputs = self._copy_nodes(bw_module, pargs, aot_id)
        with disable_proxy_modes_tracing():
            outputs = [torch.zeros(0, 0, 0, 0, 123) if isinstance(o, torch.fx.Proxy) else o
                       for o in poutputs]
        tracer.bind(outputs, poutputs)

        def proxy_subclass_constructor(subclass_meta: Any, is_runtime: bool,
                                       unwrapped_args: Sequence[Any]) -> torch.Tensor:
            @torch._dynamo.allow_in_graph
            def make_subclass(*args: Any) -> Any:
                return subclass_meta.creation_fn(args, is_runtime=is_runtime)

            poutput = tracer.record(make_subclass,
                                    tuple(pytree.tree_map(tracer.to_proxy, unwrapped_args)))
            output = placeholder_tensor()
            tracer.bind([output], [poutput])
            return output

        results = epilogue(outputs, make_subclass_override=proxy_subclass_constructor)
        return pytree.tree_map(tracer.to_proxy, results)

    def _copy_nodes(self, bw_module: torch.fx.GraphModule, pargs: list[Any],
                    aot_id: int) -> list[Any]:
        """Copy ``bw_module``'s nodes into our graph, its placeholders becoming ``pargs``;
        returns the proxies (or constants) of its outputs."""
        paste = self.paste_counts[aot_id]
        self.paste_counts[aot_id] += 1
        prefix = f"aot{aot_id}" + (f"_{paste}" if paste else "") + "_"
        remap: dict[torch.fx.Node, torch.fx.Node] = {}
        fx_tracer = self.tracer.fx_tracer
        root, graph = fx_tracer.root, fx_tracer.graph
        poutputs: list[Any] | None = None
        arg_iter = iter(pargs)
        for node in bw_module.graph.nodes:
            if node.op == "placeholder":
                pasted = next(arg_iter).node
                pasted.name = prefix + node.name
                remap[node] = pasted
            elif node.op == "output":
                poutputs = [torch.fx.Proxy(remap[n], fx_tracer)
                            if isinstance(n, torch.fx.Node) else n for n in node.args[0]]
            elif node.op in ("get_attr", "call_module"):
                qualname = fx_tracer.get_fresh_qualname(node.target)
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
        return poutputs
