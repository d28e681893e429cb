"""Memory of one training step as Inductor compiles it: its buffers, not the FX graph's values.

Inductor fuses pointwise chains and reductions into kernels (their temporaries never exist),
writes a kernel's output into an input at its last use, reuses a freed buffer of the same size,
lets the backward overwrite saved activations (donated buffers) and reorders kernels to lower
its own peak estimate. Rather than imitate those rules, this model asks Inductor: each graph
(forward, backward) goes through what ``compile_fx`` runs on it (post-grad passes, lowering,
the scheduler's fusion and reordering, wrapper code generation with its memory plan), but no
kernel is compiled. The wrapper's planned lines (allocate, reuse, reinterpret, free, extern
kernels that allocate their outputs) are the program's buffer events; ``replay`` runs them
through simulator.py's step (forward inputs held by the caller, saved values moved into the
backward, tangents allocated when it starts, gradients kept), so the result is the same
``MemoryTimeline`` the unfused simulator returns.

Sizes stay symbolic (sympy, in the graph's shape symbols) until a replay picks the shape:
``peak_expressions`` gives the peak at every shape as a few polynomials, for guards under
dynamic shapes. Measured against real runs in ``benchmarks/compiled_memory_bench.py``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx

from ..fx.sizes import saved_bytes, storage_key
from . import chunk_scratch, lowering_memo
from .scalar_codegen import scalar_kernels_where_memory_allows
from .simulator import (
    MemoryTimeline,
    _backward_inputs,
    _forward_inputs,
    _layout,
    _mark,
    _Memory,
    _output_args,
    _timeline,
    _Value,
)

log = logging.getLogger(__name__)

__all__ = [
    "Alloc",
    "Alias",
    "CompiledGraphMemory",
    "Drop",
    "Hold",
    "Workspace",
    "InductorMemoryError",
    "StepMemory",
    "donated_saved_indices",
    "lower_for_memory",
    "simulate_compiled_partition",
]


class InductorMemoryError(RuntimeError):
    """Inductor could not lower a graph for the memory model (the message says why)."""


# ---- the program: shape-independent buffer events ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class Alloc:
    """A new buffer ``name`` of ``nbytes`` (an int, or a sympy expression of shape symbols)."""

    name: str
    nbytes: Any
    label: str          # the buffer and the FX node it computes, for reports


@dataclasses.dataclass(frozen=True)
class Alias:
    """``name`` refers to the buffer ``source`` holds (a reuse, a reinterpreted view, a tuple
    item); with ``drop_source`` the old name lets go of it in the same line (a reuse)."""

    name: str
    source: str
    drop_source: bool = False


@dataclasses.dataclass(frozen=True)
class Drop:
    """The wrapper deletes ``name`` (its buffer is freed when nothing else holds it)."""

    name: str


@dataclasses.dataclass(frozen=True)
class Hold:
    """``holder`` (a returned tuple) also holds the buffer ``name`` holds."""

    holder: str
    name: str


@dataclasses.dataclass(frozen=True)
class Workspace:
    """An extern kernel (a library call: convolution, attention, ...) allocates ``nbytes``
    inside and frees them before it returns (``memory.profiled_workspace`` of its op)."""

    label: str
    nbytes: int


Event = Alloc | Alias | Drop | Hold | Workspace


@dataclasses.dataclass(frozen=True)
class CompiledGraphMemory:
    """One graph as Inductor's wrapper runs it: inputs (placeholder names, in order), the
    buffer events, and per graph output the name holding it (None: not a tensor)."""

    inputs: tuple[str, ...]
    events: tuple[Event, ...]
    outputs: tuple[str | None, ...]
    kernels: int = 0            # kernels and extern calls in the wrapper, for logs
    # FX nodes whose value got a buffer of its own, and those computed inside a kernel that
    # stores something else (fused): what ``FusionKnowledge`` learns for other cuts.
    materialized: frozenset[str] = frozenset()
    fused: frozenset[str] = frozenset()
    # Per graph output, the strides Inductor gives it (None: not a tensor, or symbolic): the
    # backward receives saved activations with these (layout optimization may change them).
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
    # The split's chunked calls: where their scratch sits, and their chunk counts (the same
    # lowering serves every count: chunk_scratch.py).
    chunked_scratch: tuple[chunk_scratch.ChunkScratch, ...] = ()
    chunk_counts: tuple[Any, ...] = ()

    def symbols(self) -> set[sympy.Symbol]:
        found: set[sympy.Symbol] = set()
        for event in self.events:
            if isinstance(event, Alloc) and isinstance(event.nbytes, sympy.Expr):
                found |= event.nbytes.free_symbols
        return found


# ---- lowering ---------------------------------------------------------------------------------

def _placeholder_values(gm: fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]


def _detached_module(graph_or_module: fx.Graph | fx.GraphModule,
                     owner: torch.nn.Module | None = None) -> fx.GraphModule:
    """A GraphModule over a copy of the graph: Inductor's passes rewrite it in place."""
    if isinstance(graph_or_module, fx.GraphModule):
        return copy.deepcopy(graph_or_module)
    graph = fx.Graph()
    out = graph.graph_copy(graph_or_module, {})
    graph.output(out)
    return fx.GraphModule(owner if owner is not None else torch.nn.Module(), graph)


@contextlib.contextmanager
def _lowering_context(fake_mode: Any) -> Iterator[None]:
    """What compile_fx_inner sets around a lowering, minus what would run kernels: no
    autotuning (it benchmarks candidates), no C++ wrapper (the Python wrapper's lines are
    the ones walked), kernels generated as source only, and on the CPU scalar only where
    the buffer plan does not depend on the vector kernels (scalar_codegen.py)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.debug import DebugContext
    from torch._inductor.virtualized import V

    patches = {"max_autotune": False, "max_autotune_gemm": False,
               "max_autotune_pointwise": False, "cpp_wrapper": False,
               "triton.cudagraphs": False, "trace.enabled": False}
    known = {k: v for k, v in patches.items() if _has_config(inductor_config, k)}
    with V.set_fake_mode(fake_mode), DebugContext(), inductor_config.patch(known), \
            scalar_kernels_where_memory_allows():
        yield


def _has_config(config: Any, name: str) -> bool:
    head, _, rest = name.partition(".")
    if not rest:
        return hasattr(config, head)
    return hasattr(getattr(config, head, None), rest)


def lower_for_memory(graph: fx.Graph | fx.GraphModule, *, is_backward: bool,
                     donated: Sequence[int] = (), owner: torch.nn.Module | None = None,
                     workspace: bool = False, user_outputs: int | None = None,
                     input_strides: Mapping[int, tuple[int, ...]] | None = None
                     ) -> CompiledGraphMemory:
    """Lower ``graph`` as Inductor compiles it and return its wrapper's buffer events.

    ``donated``: positions of backward inputs AOTAutograd donates (``donated_saved_indices``):
    Inductor may write into them. ``workspace``: also measure what each extern kernel's op
    allocates inside (runs it once per op and shape signature, ``memory.profiled_workspace``).
    ``user_outputs``: how many of a forward's outputs the user sees (their strides are kept, as
    compile_fx keeps them). ``input_strides``: placeholder position -> the strides its tensor
    arrives with (a backward's saved activations, as the compiled forward laid them out). The
    graph is not modified. InductorMemoryError when Inductor cannot lower it (the message
    names the failure). Each distinct graph is lowered once per process (lowering_memo.py:
    the result is shared, never to be modified)."""
    gm = _detached_module(graph, owner)
    values = _placeholder_values(gm)
    key = None
    if lowering_memo.memo_enabled():
        with chunk_scratch.chunk_counts_hidden(gm):  # one lowering for every chunk count
            key = lowering_memo.lowering_memo_key(
                gm, values, is_backward=is_backward, donated=donated, workspace=workspace,
                user_outputs=user_outputs, input_strides=input_strides)
        kept = lowering_memo.MEMO.get(key) if key is not None else None
        found = _at_chunk_counts(kept, gm) if kept is not None else None
        if found is not None:
            return found
    lowered = _lower(gm, values, is_backward=is_backward, donated=donated, workspace=workspace,
                     user_outputs=user_outputs, input_strides=input_strides)
    if key is not None:
        lowering_memo.MEMO.put(key, lowered)
    return lowered


def _at_chunk_counts(lowered: CompiledGraphMemory, gm: fx.GraphModule
                     ) -> CompiledGraphMemory | None:
    """``lowered`` (of ``gm`` at some chunk counts) with its chunked calls' scratch at
    ``gm``'s own counts; None when Inductor's passes changed the chunked calls (their number):
    then ``gm`` is lowered itself."""
    counts = chunk_scratch.chunk_counts(gm)
    if counts == lowered.chunk_counts:
        return lowered
    if len(counts) != len(lowered.chunk_counts):
        return None
    events, slots = chunk_scratch.rescratched(lowered.events, lowered.chunked_scratch, gm,
                                              Workspace)
    return dataclasses.replace(lowered, events=events, chunked_scratch=slots,
                               chunk_counts=counts)


def _lower(gm: fx.GraphModule, values: list[Any], *, is_backward: bool, donated: Sequence[int],
           workspace: bool, user_outputs: int | None,
           input_strides: Mapping[int, tuple[int, ...]] | None) -> CompiledGraphMemory:
    """``lower_for_memory`` without the memo: ``gm`` is a copy this may rewrite."""
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import _recursive_post_grad_passes
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    fake_mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    if fake_mode is None:
        raise InductorMemoryError("the graph's placeholders carry no fake tensors "
                                  "(meta['val']): nothing to lower")
    if input_strides:
        values = _restrided(gm, values, input_strides, fake_mode)
    try:
        with _lowering_context(fake_mode):
            gm = _with_inductor_decompositions(gm, values, fake_mode)
            _mark_user_visible_outputs(gm, is_backward, user_outputs)
            _before_post_grad(gm, values)
            _recursive_post_grad_passes(gm, is_inference=False)
            lowering = GraphLowering(gm, example_inputs=values, shape_env=fake_mode.shape_env,
                                     is_inference=False, is_backward=is_backward)
            if is_backward:
                lowering.bw_donated_idxs = list(donated)
            with V.set_graph_handler(lowering):
                lowering.run(*values)
                lowering.init_wrapper_code()
                lowering._update_scheduler()
                wrapper = lowering.wrapper_code
                wrapper.push_codegened_graph(lowering)
                lowering.scheduler.codegen()
                code = wrapper.generate(lowering.is_inference)
                wrapper.pop_codegened_graph()
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("the %s wrapper the memory model walks:\n%s",
                              "backward" if is_backward else "forward",
                              getattr(code[0], "value", code[0]))
                return _program(lowering, gm, workspace)
    except InductorMemoryError:
        raise
    except Exception as error:
        raise InductorMemoryError(
            f"Inductor could not lower the {'backward' if is_backward else 'forward'} graph "
            f"for the memory model: {type(error).__name__}: {error}") from error


def _mark_user_visible_outputs(gm: fx.GraphModule, is_backward: bool,
                               user_outputs: int | None) -> None:
    """The outputs whose strides Inductor must keep, as compile_fx marks them: a forward's
    user outputs (``keep_output_stride``), a backward's gradients (``bw_outputs_user_visible``);
    the layouts of the rest (saved activations) are Inductor's choice."""
    from torch._inductor import config as inductor_config

    output = next(iter(gm.graph.find_nodes(op="output")))
    outputs = _output_args(gm.graph)
    if is_backward:
        keep = bool(getattr(inductor_config, "bw_outputs_user_visible", True))
        count = len(outputs) if keep else 0
    else:
        keep = bool(getattr(inductor_config, "keep_output_stride", True))
        count = (len(outputs) if user_outputs is None else user_outputs) if keep else 0
    output.meta["user_visible_output_idxs"] = [
        i for i in range(count) if isinstance(outputs[i], fx.Node)]


def _restrided(gm: fx.GraphModule, values: list[Any], strides: Mapping[int, tuple[int, ...]],
               fake_mode: Any) -> list[Any]:
    """Placeholders whose tensors arrive with other strides get them (AOTAutograd does the
    same to a backward before compiling it, from the compiled forward's output strides)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    out = list(values)
    with fake_mode:
        for index, stride in strides.items():
            val = out[index] if index < len(out) else None
            if not isinstance(val, torch.Tensor) or len(stride) != val.dim():
                continue
            if any(not isinstance(s, int) for s in val.stride()) or tuple(val.stride()) == stride:
                continue
            out[index] = val.as_strided(val.size(), stride)
            placeholders[index].meta["val"] = out[index]
    return out


def _before_post_grad(gm: fx.GraphModule, values: Sequence[Any]) -> None:
    """What compile_fx runs on a graph before its post-grad passes: views become reshapes
    (layout optimization may make a tensor channels-last), values are propagated again and the
    outputs' strides recorded (the user-visible ones are kept)."""
    from torch._inductor import compile_fx

    view_to_reshape = getattr(compile_fx, "view_to_reshape", None)
    if view_to_reshape is not None:
        view_to_reshape(gm)
    propagate = getattr(compile_fx, "fake_tensor_prop", None)
    if propagate is not None:
        with torch.no_grad():
            propagate(gm, list(values))
    record = getattr(compile_fx, "_recursive_record_original_output_strides", None)
    if record is not None:
        record(gm)


def _with_inductor_decompositions(gm: fx.GraphModule, values: Sequence[Any],
                                  fake_mode: Any) -> fx.GraphModule:
    """``gm`` in the ops Inductor lowers: a joint AOTAutograd traced for Inductor already is;
    one traced without its decompositions (``aot_function`` with other compilers) is traced
    again through them, as compile_fx's AOTAutograd would have."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings
    from torch.fx.experimental.proxy_tensor import make_fx

    # Ops with a lowering stay (some also have a decomposition that applies only in some
    # cases); an op Inductor only decomposes means the graph was not traced for Inductor.
    table = select_decomp_table()
    if not any(n.op == "call_function" and n.target in table and n.target not in lowerings
               for n in gm.graph.nodes):
        return gm
    with fake_mode:
        traced = make_fx(gm, decomposition_table=table)(*values)
    return traced


def _nbytes(lowering: Any, node: Any) -> Any:
    """The bytes Inductor allocates for ``node``: its storage (padding included) times the
    dtype's size, as a sympy expression of the shape symbols (an int when static)."""
    from torch._inductor.utils import get_dtype_size

    try:
        elements = lowering.get_allocation_storage_size(node)
    except Exception:  # a buffer kind without an allocation size: its layout's storage
        elements = node.get_layout().storage_size()
    expr = sympy.sympify(elements) * get_dtype_size(node.get_dtype())
    return int(expr) if expr.is_Integer else expr


def _label(node: Any) -> str:
    name = node.get_name()
    origin = getattr(node, "origin_node", None)
    if origin is None:
        origins = sorted(getattr(node, "origins", ()) or (), key=lambda n: n.name)
        origin = origins[-1] if origins else None
    return f"{name} ({origin.name})" if origin is not None else name


def _extern_origin(node: Any) -> fx.Node | None:
    """The FX node an extern kernel calls the op of (its origin of that op)."""
    op = getattr(node, "op_overload", None)
    origin = getattr(node, "origin_node", None)
    if isinstance(origin, fx.Node) and (op is None or origin.target is op):
        return origin
    found = [n for n in (getattr(node, "origins", None) or ())
             if isinstance(n, fx.Node) and op is not None and n.target is op]
    return found[0] if len(found) == 1 else None


def _is_chunked_loss(node: Any) -> bool:
    """An extern call of the split's ops (chunked_loss): their scratch is known from the shapes,
    so it is counted even where measuring library scratch is off."""
    from ..split.chunked_loss import CHUNKED_OPS
    from ..split.chunked_mlp import CHUNKED_OPS as CHUNKED_MLP_OPS

    op = getattr(node, "op_overload", None)
    return op in CHUNKED_OPS or op in CHUNKED_MLP_OPS


def _extern_inputs(node: Any) -> tuple[fx.Node, list[fx.Node], dict[fx.Node, tuple[int, ...]]] | None:
    """An extern kernel's FX origin, its tensor inputs, and the strides they arrive with in
    the kernel (Inductor may have made them channels-last, which changes what a library
    reorders); None when the origin is not known."""
    origin = _extern_origin(node)
    if origin is None or "val" not in origin.meta:
        return None
    leaves = chunk_scratch.tensor_inputs(origin)
    inputs = [x for x in getattr(node, "inputs", ()) if hasattr(x, "get_stride")]
    strides: dict[fx.Node, tuple[int, ...]] = {}
    if len(leaves) == len(inputs):
        for leaf, ir_input in zip(leaves, inputs):
            try:
                strides[leaf] = tuple(int(s) for s in ir_input.get_stride())
            except Exception:  # a symbolic stride: the value's own
                continue
    return origin, leaves, strides


def _extern_workspace(node: Any, with_outputs: bool = False) -> list[Event]:
    """The workspace event of an extern kernel whose op can be measured (none if 0): its FX
    op run on tensors laid out as the kernel's inputs are. ``with_outputs``: the transient
    includes the op's outputs (a multi-output kernel's items, not yet allocated here)."""
    found = _extern_inputs(node)
    if found is None:
        return []
    nbytes = chunk_scratch.scratch_bytes(found[0], found[2], with_outputs)
    return [Workspace(_label(node), nbytes)] if nbytes else []


def _chunk_slot(node: Any, position: int, with_outputs: bool
                ) -> tuple[chunk_scratch.ChunkScratch | None, list[Event]]:
    """A chunked call's scratch (``_extern_workspace``) and where it sits, to work it out
    again at other chunk counts (chunk_scratch.py)."""
    found = _extern_inputs(node)
    if found is None:
        return None, []
    origin, leaves, strides = found
    nbytes = chunk_scratch.scratch_bytes(origin, strides, with_outputs)
    slot = chunk_scratch.ChunkScratch(
        position, chunk_scratch.chunked_calls(origin.graph).index(origin),
        tuple(strides.get(leaf) for leaf in leaves), with_outputs, _label(node), nbytes > 0)
    return slot, ([Workspace(slot.label, nbytes)] if nbytes else [])


def _program(lowering: Any, gm: fx.GraphModule, workspace: bool = False
             ) -> CompiledGraphMemory:
    """Walk the planned wrapper lines into buffer events (see the module doc)."""
    from torch._inductor import ir

    removed = set(lowering.removed_buffers)
    events: list[Event] = []
    slots: list[chunk_scratch.ChunkScratch] = []
    kernels = 0

    def scratch(node: Any, with_outputs: bool = False) -> None:
        if _is_chunked_loss(node):
            slot, made = _chunk_slot(node, len(events), with_outputs)
            slots.extend([slot] if slot is not None else [])
            events.extend(made)
        elif workspace:
            events.extend(_extern_workspace(node, with_outputs))

    for line in lowering.wrapper_code.lines:
        kind = type(line).__name__
        if kind == "AllocateLine":
            name = line.node.get_name()
            if name not in removed:
                events.append(Alloc(name, _nbytes(lowering, line.node), _label(line.node)))
        elif kind == "ReuseLine":
            old, new = line.node.get_name(), line.reused_as.get_name()
            if old not in removed:
                events.append(Alias(new, old, drop_source=bool(line.delete_old)))
        elif kind == "ReinterpretLine":
            events.append(Alias(line.reused_as.get_name(), line.node.get_name()))
        elif kind == "FreeIfNotReusedLine":
            name = line.node.get_name()
            if name not in removed and not line.is_reused:
                events.append(Drop(name))
        elif kind == "FreeLine":
            events.append(Drop(line.node.get_name()))
        elif kind == "ExternKernelAllocLine":
            kernels += 1
            node = line.node
            aliased = [n.get_name() for n in _aliased_inputs(node)]
            if aliased:
                events.append(Alias(node.get_name(), aliased[0]))
            elif isinstance(node.layout, ir.MultiOutputLayout):
                events.append(Alloc(node.get_name(), 0, _label(node)))  # the returned tuple
            else:
                events.append(Alloc(node.get_name(), _nbytes(lowering, node), _label(node)))
            # A tuple's items are bound after the call (and after frees of its inputs), but
            # the library allocated them before its scratch: they peak together.
            scratch(node, with_outputs=isinstance(node.layout, ir.MultiOutputLayout))
        elif kind == "MultiOutputLine":
            events.extend(_tuple_item(lowering, line))
        elif kind in ("KernelCallLine", "ExternKernelOutLine", "ExternKernelMultiOutLine"):
            kernels += 1
            if kind != "KernelCallLine":
                scratch(line.node)
    inputs = tuple(n.name for n in gm.graph.find_nodes(op="placeholder"))
    materialized, fused = _fusion_of(lowering, events)
    return CompiledGraphMemory(inputs, tuple(events), _output_names(lowering), kernels,
                               materialized, fused, _output_strides(lowering), tuple(slots),
                               chunk_scratch.chunk_counts(gm))


def _output_strides(lowering: Any) -> tuple[tuple[int, ...] | None, ...]:
    strides: list[tuple[int, ...] | None] = []
    for out in lowering.graph_outputs:
        try:
            stride = tuple(int(s) for s in out.get_stride())
        except Exception:  # not a tensor, or a symbolic stride
            stride = None
        strides.append(stride)
    return tuple(strides)


def _fusion_of(lowering: Any, events: Sequence[Event]) -> tuple[frozenset[str], frozenset[str]]:
    """(FX nodes with a buffer of their own, FX nodes computed inside other nodes' kernels)."""
    allocated = {e.name for e in events if isinstance(e, Alloc)}
    own: set[str] = set()
    inside: set[str] = set()
    for buf in lowering.buffers:
        origin = getattr(buf, "origin_node", None)
        origins = {n.name for n in (getattr(buf, "origins", None) or ())}
        if origin is not None and buf.get_name() in allocated:
            own.add(origin.name)
        inside |= origins
    return frozenset(own), frozenset(inside - own)


def _aliased_inputs(node: Any) -> list[Any]:
    get = getattr(node, "get_inputs_that_alias_output", None)
    names = get() if get is not None else []
    return [n for n in (V_graph_buffer(name) for name in names) if n is not None]


def V_graph_buffer(name: str) -> Any:  # noqa: N802 - reads V.graph, as Inductor names it
    from torch._inductor.virtualized import V

    graph = V.graph
    return graph.name_to_buffer.get(name) or graph.graph_inputs.get(name)


def _tuple_item(lowering: Any, line: Any) -> list[Event]:
    """``bufN = bufM[i]``: an item of an extern kernel's returned tuple. The kernel allocated
    it; it is modelled as allocated here (the line follows the call at once) and held by the
    tuple too, so ``del bufM`` lets go of the items."""
    parent = str(line.arg_name).split("[", 1)[0]
    node = lowering.name_to_buffer.get(line.result_name)
    nbytes = _nbytes(lowering, node) if node is not None else 0
    label = _label(node) if node is not None else line.result_name
    return [Alloc(line.result_name, nbytes, label), Hold(parent, line.result_name)]


def _output_names(lowering: Any) -> tuple[str | None, ...]:
    from torch._inductor import ir

    names: list[str | None] = []
    for out in lowering.graph_outputs:
        if isinstance(out, (ir.NoneAsConstantBuffer, ir.ShapeAsConstantBuffer)):
            names.append(None)
            continue
        try:
            names.append(out.get_name())
        except Exception:
            names.append(None)
    return tuple(names)


# ---- which saved tensors the backward may overwrite -------------------------------------------

def donated_saved_indices(fw: fx.Graph, bw: fx.Graph) -> list[int]:
    """Backward input positions AOTAutograd donates to Inductor (torch's
    ``donated_buffer`` flag, on by default): saved tensors sharing no storage with a forward
    input, a user output or a gradient. Positions count the saved symbolic scalars first, as
    the backward's placeholders do."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not bool(getattr(torch._functorch.config, "donated_buffer", False)):
        return []
    if _mutates_metadata(fw) or _mutates_metadata(bw):
        return []
    layout = _layout(fw, bw)
    fw_out = _output_args(fw)
    user = fw_out[:layout.num_user_outputs]
    saved = fw_out[layout.num_user_outputs:layout.num_user_outputs + layout.num_saved_tensors]
    others = [n.meta.get("val") for n in fw.find_nodes(op="placeholder")]
    others += [a.meta.get("val") for a in user if isinstance(a, fx.Node)]
    others += [a.meta.get("val") for a in _output_args(bw) if isinstance(a, fx.Node)]
    storages = {storage_key(t) for t in others if isinstance(t, FakeTensor)}
    donated = []
    for i, node in enumerate(saved):
        val = node.meta.get("val") if isinstance(node, fx.Node) else None
        if isinstance(val, FakeTensor) and not val.is_sparse and storage_key(val) not in storages:
            donated.append(layout.num_saved_syms + i)
    return donated


def _mutates_metadata(graph: fx.Graph) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.aten.set_.source_Tensor
               for n in graph.nodes)


# ---- replaying a step -------------------------------------------------------------------------

SizeOf = Callable[[Any], int]


def hinted_sizes(shape_env: Any = None) -> SizeOf:
    """Evaluate a size at the shape symbols' hints (the shapes the graph was traced at); a
    symbol without one (unbacked) counts as ``sizes.UNBACKED_FALLBACK``, as ``size_hint``."""
    from ..fx.sizes import UNBACKED_FALLBACK
    from .shape_guards import shape_hints

    hints = shape_hints(shape_env)

    def size_of(expr: Any) -> int:
        if isinstance(expr, int):
            return expr
        values = {s: hints.get(s, UNBACKED_FALLBACK) for s in expr.free_symbols}
        return int(expr.xreplace(values))
    return size_of


def sizes_at(values: Mapping[sympy.Symbol, int]) -> SizeOf:
    """Evaluate a size with every shape symbol replaced by ``values``."""
    def size_of(expr: Any) -> int:
        return expr if isinstance(expr, int) else int(expr.xreplace(dict(values)))
    return size_of


class _Replay:
    """Runs a graph's events on simulator.py's reference-counted buffers."""

    def __init__(self, mem: _Memory, phase: str, size_of: SizeOf) -> None:
        self.mem = mem
        self.phase = phase
        self.size_of = size_of
        self.env: dict[str, _Value] = {}
        self._frees_pending = False

    def _close_frees(self) -> None:
        if self._frees_pending:
            self.mem.step(self.phase, "free", "free")
            self._frees_pending = False

    def _bind(self, name: str, value: _Value) -> None:
        old = self.env.get(name)
        self.env[name] = value
        self.mem.hold(value)
        if old is not None:
            self._drop(old)

    def _drop(self, value: _Value) -> None:
        before = len(self.mem._pending_free)
        self.mem.drop(value)
        self._frees_pending |= len(self.mem._pending_free) > before

    def run(self, program: CompiledGraphMemory, inputs: Sequence[_Value]) -> list[_Value]:
        """Run ``program`` on ``inputs`` (their references move into the graph's names);
        return the outputs, each held once for the caller."""
        for name, value in zip(program.inputs, inputs):
            self.env[name] = value
        for event in program.events:
            if isinstance(event, Alloc):
                self._close_frees()
                buf = self.mem.new(event.label, self.size_of(event.nbytes), "computed",
                                   event.nbytes)
                self._bind(event.name, [(None, buf)])
                self.mem.step(self.phase, event.label, "alloc")
            elif isinstance(event, Hold):
                item = self.env.get(event.name, [])
                self.mem.hold(item)
                self.env[event.holder] = self.env.get(event.holder, []) + item
            elif isinstance(event, Alias):
                source = self.env.get(event.source)
                if source is None:
                    continue
                self._bind(event.name, list(source))
                if event.drop_source:
                    self._drop(self.env.pop(event.source))
            elif isinstance(event, Workspace):
                self._close_frees()
                self.mem.step(self.phase, event.label, "workspace", event.nbytes)
            elif isinstance(event, Drop) and event.name in self.env:
                self._drop(self.env.pop(event.name))
        outputs = [list(self.env.get(name, [])) if name is not None else []
                   for name in program.outputs]
        for value in outputs:
            self.mem.hold(value)
        for value in self.env.values():  # the frame ends
            self._drop(value)
        self.env.clear()
        self._frees_pending = False
        self.mem.step(self.phase, "output", "output")
        return outputs


@dataclasses.dataclass
class StepMemory:
    """The two programs of one partition, and how to replay them as one step."""

    fw: fx.Graph
    bw: fx.Graph
    forward: CompiledGraphMemory
    backward: CompiledGraphMemory
    shape_env: Any = None

    def timeline(self, *, num_static_inputs: int | None = None,
                 static_input_indices: Iterable[int] | None = None,
                 hold_outputs: bool = True, alignment: int = 1,
                 size_of: SizeOf | None = None, allocator: str | None = None
                 ) -> MemoryTimeline:
        """The step's memory timeline at the traced shapes (or at ``size_of``'s);
        ``allocator="cuda"`` counts the CUDA caching allocator's blocks (simulator.py)."""
        size_of = size_of if size_of is not None else hinted_sizes(self.shape_env)
        layout = _layout(self.fw, self.bw)
        mem = _Memory(alignment, allocator)
        fw_values = _forward_inputs(mem, self.fw, num_static_inputs, static_input_indices)
        _resize(fw_values, size_of)
        for value in fw_values:
            mem.hold(value)  # the caller's reference, kept to the end of the step
        fw_in = [list(v) for v in fw_values]
        for value in fw_in:
            mem.hold(value)
        fw_out = _Replay(mem, "forward", size_of).run(self.forward, fw_in)
        _mark(fw_out[:layout.num_user_outputs], "output")
        _mark(fw_out[layout.num_user_outputs:], "saved")
        saved = saved_bytes(a for a in _output_args(self.fw)[layout.num_user_outputs:]
                            if isinstance(a, fx.Node))
        if not hold_outputs:
            for value in fw_out[:layout.num_user_outputs]:
                mem.drop(value)
        bw_in = _backward_inputs(mem, self.bw, layout.backward_saved_order(fw_out))
        _resize(bw_in[layout.num_saved_tensors + layout.num_saved_syms:], size_of)  # tangents
        grads = _Replay(mem, "backward", size_of).run(self.backward, bw_in)
        _mark(grads, "gradient")
        return _timeline(mem, fw_values, saved)


def _resize(values: Sequence[_Value], size_of: SizeOf) -> None:
    """Inputs and tangents sized at ``size_of``'s shapes (simulator.py sizes them at the hints;
    their ``expr`` already carries the allocator's rounding)."""
    for value in values:
        for _, buf in value:
            if buf.expr is not None:
                buf.nbytes = size_of(buf.expr)


def _shape_env_of(graph: fx.Graph) -> Any:
    from torch._guards import detect_fake_mode

    values = [n.meta.get("val") for n in graph.find_nodes(op="placeholder")]
    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    return getattr(mode, "shape_env", None)


def lower_partition(fw: fx.Graph | fx.GraphModule, bw: fx.Graph | fx.GraphModule,
                    owner: torch.nn.Module | None = None, *, workspace: bool = False
                    ) -> StepMemory:
    """Both graphs of a partition lowered for the memory model (see ``lower_for_memory``)."""
    fw_graph = fw.graph if isinstance(fw, fx.GraphModule) else fw
    bw_graph = bw.graph if isinstance(bw, fx.GraphModule) else bw
    layout = _layout(fw_graph, bw_graph)
    forward = lower_for_memory(fw, is_backward=False, owner=owner, workspace=workspace,
                               user_outputs=layout.num_user_outputs)
    saved = forward.output_strides[layout.num_user_outputs:
                                   layout.num_user_outputs + layout.num_saved_tensors]
    arriving = {layout.num_saved_syms + i: stride for i, stride in enumerate(saved)
                if stride is not None}
    backward = lower_for_memory(bw, is_backward=True, owner=owner, workspace=workspace,
                                donated=donated_saved_indices(fw_graph, bw_graph),
                                input_strides=arriving)
    log.debug("lowered a partition for the memory model: %d forward events, %d backward",
              len(forward.events), len(backward.events))
    return StepMemory(fw_graph, bw_graph, forward, backward, _shape_env_of(fw_graph))


def simulate_compiled_partition(
    fw: fx.Graph | fx.GraphModule,
    bw: fx.Graph | fx.GraphModule,
    *,
    num_static_inputs: int | None = None,
    static_input_indices: Iterable[int] | None = None,
    hold_outputs: bool = True,
    alignment: int = 1,
    workspace: bool = True,
    allocator: str | None = None,
) -> MemoryTimeline:
    """The memory timeline of one step as Inductor compiles the two graphs (forward, then
    backward): ``simulate_partition``'s step with Inductor's buffers in place of the graphs'
    values. ``alignment``: allocation granularity; ``allocator="cuda"``: the blocks the CUDA
    caching allocator hands out, as ``max_memory_allocated`` counts them (simulate_partition).
    ``workspace``: add what extern
    kernels (oneDNN and cuDNN convolutions, attention) allocate inside, measured once per op
    and layout by running the op on random tensors laid out as the kernel's inputs."""
    owner = fw if isinstance(fw, fx.GraphModule) else None
    return lower_partition(fw, bw, owner, workspace=workspace).timeline(
        num_static_inputs=num_static_inputs, static_input_indices=static_input_indices,
        hold_outputs=hold_outputs, alignment=alignment, allocator=allocator)
