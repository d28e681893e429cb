"""From a recorded graph to what ``compiler_fn`` gets, and calling ``compiler_fn``.

Once the engine has walked the whole backward, the recorded graph is cleaned up (the passes in
:mod:`compiled_autograd.passes`), wrapped in a ``GraphModule`` marked for Dynamo, logged, and
handed to the user's compiler.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.utils import set_locals_to_steal
from torch.fx import GraphModule

from compiled_autograd import logs, passes
from compiled_autograd.state import STATE

graph_logger = logging.getLogger("compiled_autograd.graph")


class CompilerFnError(RuntimeError):
    """``compiler_fn`` raised while compiling a captured backward graph."""


@dataclass(frozen=True)
class FinishedGraph:
    module: GraphModule
    used_sizes: list[int]  # the engine's size indices the graph still reads, in graph order
    cpu_scalars_to_cuda: list[int]  # input indices the runtime moves to CUDA first


def finish_graph(root: torch.nn.Module, graph: torch.fx.Graph, capture_id: int) -> FinishedGraph:
    """Run the clean-up passes on ``graph`` and wrap it as ``CompiledAutograd<capture_id>``."""
    # Before stripping: finding CPU scalars needs the fake values' devices.
    to_cuda = passes.move_cpu_scalars_to_cuda(graph) if STATE.cpu_scalars_to_cuda() else []
    passes.strip_fake_metadata(graph)
    passes.run_all(graph)
    used_sizes = passes.remove_unused_sizes(graph)
    module = GraphModule(root, graph, f"CompiledAutograd{capture_id}")
    # Dynamo then keeps ``inputs`` as ONE list argument and clears it once unpacked, so
    # each saved activation is freed as soon as the compiled graph is done with it.
    set_locals_to_steal(module, ["inputs"])
    if graph_logger.isEnabledFor(logging.INFO):  # printing a big graph is not free
        graph_logger.info("compiled autograd graph %d:\n%s", capture_id,
                          module.print_readable(print_output=False))
    logs.log_graph(module)  # torch's loggers and format (TORCH_LOGS=compiled_autograd)
    return FinishedGraph(module, used_sizes, to_cuda)


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


def compile_graph(compiler_fn: Callable[..., Any], module: GraphModule) -> Any:
    """``compiler_fn``'s result for ``module``; its failure becomes a :class:`CompilerFnError`
    naming the function and the graph."""
    STATE.compiles += 1
    try:
        return call_compiler_fn(compiler_fn, module)
    except Exception as error:
        name = getattr(compiler_fn, "__name__", type(compiler_fn).__name__)
        calls = sum(1 for n in module.graph.nodes if n.op == "call_function")
        raise CompilerFnError(
            f"compiler_fn {name!r} failed on compiled-autograd graph {module._get_name()} "
            f"({calls} calls): {type(error).__name__}: {error}") from error
