"""Split: the LM head and its loss computed in chunks of tokens (the planner's fourth choice).

Keep, recompute and offload decide where a value lives; none shrinks a value that is big while
it exists. The largest such value in language-model training is the final projection's output
and the loss around it: logits of [tokens x vocab], often cast to fp32, their softmax and their
gradient. ``find_split_sites`` recognises, in a traced torch-level graph (Dynamo's, or
``torch.fx.symbolic_trace``'s),

    linear(hidden, weight, bias?)  ->  [cast to a float dtype]  ->  [view / reshape / flatten /
    contiguous / slicing of token dims]  ->  cross_entropy(logits [tokens, vocab], target
    [tokens], ignore_index=..., reduction="mean" | "sum", label_smoothing=...), or
    nll_loss(log_softmax(logits, dim=-1), target, ignore_index=..., reduction=...)

with nothing else reading the logits, and ``split_token_wise`` replaces each such chain by one
call of ``torch.ops.aot_partition.linear_cross_entropy`` (chunked_loss.py) on the hidden states
flattened to [tokens, dim]: a custom op, so Inductor runs its chunks one after another instead of
fusing them back together. What does not match exactly is left alone, with the reason.

Not matched (left alone, reason given): class weights; reduction "none"; a class dimension
other than the last; logits read by anything else (returned, logged); a cast to a non-float
dtype; an autocast region in the graph (the op would not see autocast's dtype choices); logits
that are an input of the graph (a graph break between the projection and the loss).

The MLP (Mini-Sequence Transformer), with ``find_split_sites(gm, kinds=("loss", "mlp"))``: a
token-wise feed-forward whose [tokens x hidden] intermediate nothing else reads,

    linear(act(linear(x, up)), down)                                  (GPT's, BERT's)
    linear(act(linear(x, gate)) * linear(x, up), down)                (SwiGLU, GeGLU: Llama's,
                                                                       Mistral's, Qwen2's)

each linear with or without a bias, act one of relu, silu, gelu (exact or tanh), x [..., dim]
(every leading dim a token dim, at least 2 tokens), is replaced by one call of
``torch.ops.aot_partition.token_mlp`` (chunked_mlp.py): the forward keeps x only, the backward
recomputes each chunk's intermediates. Left alone, with the reason: an intermediate read by
anything else (dropout inside the MLP, a returned or logged activation); mixed dtypes; an
autocast region; a projection by ``addmm`` (GPT-2's Conv1D, whose hand-written tanh GELU is not
one call either); an MLP sharing a node with another site (a loss site's projection, or
back-to-back MLPs: the first one wins).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import operator
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import chunked_loss, chunked_mlp

log = logging.getLogger(__name__)

_LINEARS = (torch._C._nn.linear, F.linear, torch.ops.aten.linear.default)
_CROSS_ENTROPIES = (F.cross_entropy, F.nll_loss)
_LOG_SOFTMAXES = (F.log_softmax, torch.log_softmax)
_CAST_METHODS = {"float": torch.float32, "double": torch.float64, "half": torch.float16,
                 "bfloat16": torch.bfloat16}
_SHAPE_METHODS = ("view", "reshape", "flatten", "contiguous")
_SHAPE_FUNCTIONS = (torch.flatten, torch.reshape)
_SIGNATURES: dict[Any, inspect.Signature] = {
    F.cross_entropy: inspect.signature(F.cross_entropy),
    F.nll_loss: inspect.signature(F.nll_loss)}
# Autocast regions as Dynamo records them: the op would not see autocast's dtype choices.
_AUTOCAST_TARGETS = tuple(t for t in (
    getattr(torch.amp.autocast_mode, "_enter_autocast", None),
    getattr(torch._C, "_set_autocast_enabled", None)) if t is not None)


@dataclasses.dataclass(frozen=True)
class SplitSite:
    """A final projection and its cross-entropy that can be computed in chunks of tokens."""

    loss: str                # the cross_entropy node
    linear: str              # the projection node
    tokens: int              # rows of the logits (at the traced shapes' hints)
    vocab: int
    dtype: torch.dtype       # the loss's compute dtype (the logits after the cast)
    reduction: str
    ignore_index: int
    label_smoothing: float
    # internal: the nodes the rewrite reads and removes
    hidden: fx.Node = dataclasses.field(repr=False, compare=False)
    weight: fx.Node = dataclasses.field(repr=False, compare=False)
    bias: fx.Node | None = dataclasses.field(repr=False, compare=False)
    target: fx.Node = dataclasses.field(repr=False, compare=False)
    # the projection, then each node after it up to the loss's input, in run order
    chain: tuple[fx.Node, ...] = dataclasses.field(repr=False, compare=False)

    projection_dtype: torch.dtype = torch.float32  # the projection's (before any cast)

    kind: ClassVar[str] = "loss"

    @property
    def logits_bytes(self) -> int:
        """One [tokens x vocab] buffer in the compute dtype: what each chunk divides."""
        return self.tokens * self.vocab * self.dtype.itemsize

    def bytes_saved(self, chunks: int) -> int:
        """An estimate of what splitting lowers the peak by: whole, a compiler keeps the
        projection's output (its dtype; the cast and the loss fused into one pass); split, a
        chunk holds its logits in the compute dtype, the projection's output before the cast
        and the gradient cast back (chunked_loss.workspace_bytes). Negative: no gain."""
        rows = -(-self.tokens // max(1, chunks))
        low = self.projection_dtype.itemsize
        per_element = self.dtype.itemsize + (2 * low if self.projection_dtype != self.dtype
                                             else 0)
        return self.tokens * self.vocab * low - rows * self.vocab * per_element

    def chunk_bytes(self, chunks: int) -> int:
        rows = -(-self.tokens // max(1, chunks))
        return rows * self.vocab * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class MlpSplitSite:
    """A token-wise MLP (plain or gated) that can be computed in chunks of tokens."""

    down: str                # the down projection node (the op takes its place)
    activation: str          # one of chunked_mlp.ACTIVATIONS
    gated: bool              # act(gate(x)) * up(x); else act(up(x))
    tokens: int              # rows of x with its token dims flattened (at the traced hints)
    dim: int                 # x's features
    hidden: int              # the intermediate's width
    out: int                 # the down projection's outputs
    dtype: torch.dtype
    # internal: the nodes the rewrite reads and removes
    x: fx.Node = dataclasses.field(repr=False, compare=False)
    up_weight: fx.Node = dataclasses.field(repr=False, compare=False)
    up_bias: fx.Node | None = dataclasses.field(repr=False, compare=False)
    gate_weight: fx.Node | None = dataclasses.field(repr=False, compare=False)
    gate_bias: fx.Node | None = dataclasses.field(repr=False, compare=False)
    down_weight: fx.Node = dataclasses.field(repr=False, compare=False)
    down_bias: fx.Node | None = dataclasses.field(repr=False, compare=False)
    # the projections, the activation and the product, then the down projection, in run order
    chain: tuple[fx.Node, ...] = dataclasses.field(repr=False, compare=False)

    kind: ClassVar[str] = "mlp"

    @property
    def loss(self) -> str:
        """The site's name in logs (the down projection), as a loss site's is its loss."""
        return self.down

    @property
    def intermediate_bytes(self) -> int:
        """One [tokens x hidden] intermediate: what each chunk divides."""
        return self.tokens * self.hidden * self.dtype.itemsize

    def chunk_bytes(self, chunks: int) -> int:
        rows = -(-self.tokens // max(1, chunks))
        return rows * self.hidden * self.dtype.itemsize

    def bytes_saved(self, chunks: int) -> int:
        """An estimate of what splitting lowers the peak by: whole, a compiler keeps the
        intermediates for the backward (the gate's and the up projection's outputs, gated; the
        up projection's, plain) and its backward holds about as many [tokens x hidden]
        gradients at once; split, the forward keeps x only (kept or recomputed anyway) and a
        chunk's backward holds at most five [rows x hidden] buffers
        (chunked_mlp.workspace_bytes). Negative: no gain."""
        kept = 2 if self.gated else 1
        alive = (4 if self.gated else 3) + (0 if self.activation == "relu" else 1)
        return kept * self.intermediate_bytes - alive * self.chunk_bytes(chunks)

    def describe(self, chunks: int) -> str:
        if chunks <= 1:
            return f"{self.down}: not split"
        shape = ("act(gate(x)) * up(x)" if self.gated else "act(up(x))")
        return (f"{self.down} (MLP down({shape}), act {self.activation}, {self.tokens} tokens "
                f"x {self.dim} -> {self.hidden} -> {self.out}, "
                f"{str(self.dtype).removeprefix('torch.')}): split into {chunks} chunks "
                f"(recompute), intermediate {self.intermediate_bytes:,} -> "
                f"{self.chunk_bytes(chunks):,} bytes a buffer; about "
                f"{max(0, self.bytes_saved(chunks)):,} bytes off the peak (estimated)")


# How the gradients are made: "forward_grads" (each chunk's gradient computed while its logits
# exist, in the forward; the backward scales them: no matmul more than unsplit, the [tokens,
# dim] and [vocab, dim] gradients kept from forward to backward) or "recompute" (the forward
# keeps each token's log-sum-exp; the backward recomputes each chunk's logits: one matmul
# more). Without gradients to make (inference), the forward computes the loss only.
SPLIT_MODES = ("forward_grads", "recompute")


@dataclasses.dataclass(frozen=True)
class SplitDecision:
    """What ``split_token_wise`` did at one site (``chunks`` 1: left whole)."""

    site: SplitSite | MlpSplitSite
    chunks: int
    mode: str = "forward_grads"

    def describe(self) -> str:
        if isinstance(self.site, MlpSplitSite):
            return self.site.describe(self.chunks)
        if self.chunks <= 1:
            return f"{self.site.loss}: not split"
        return (f"{self.site.loss} (linear {self.site.linear}, {self.site.tokens} tokens x "
                f"{self.site.vocab} vocab, {str(self.site.dtype).removeprefix('torch.')}): "
                f"split into {self.chunks} chunks ({self.mode.replace('_', ' ')}), logits "
                f"{self.site.logits_bytes:,} -> {self.site.chunk_bytes(self.chunks):,} bytes a "
                f"buffer; about {max(0, self.site.bytes_saved(self.chunks)):,} bytes off the "
                f"peak (estimated)")


@dataclasses.dataclass(frozen=True)
class LeftAlone:
    """A cross_entropy (kind "loss") or an MLP (kind "mlp": ``loss`` names its activation or
    projection node) the split does not rewrite, and why."""

    loss: str
    reason: str
    kind: str = "loss"


def _value(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def _hint(size: Any) -> int:
    if isinstance(size, torch.SymInt):
        return int(size.node.hint) if size.node.hint is not None else 0
    return int(size)


def _cast_dtype(node: fx.Node) -> torch.dtype | None | bool:
    """The dtype a cast node casts to; None: not a cast; False: a cast we do not follow."""
    if node.op == "call_method" and node.target in _CAST_METHODS and len(node.args) == 1 \
            and not node.kwargs:
        return _CAST_METHODS[str(node.target)]
    if node.op == "call_method" and node.target == "to":
        rest = list(node.args[1:]) + list(node.kwargs.values())
        dtypes = [a for a in rest if isinstance(a, torch.dtype)]
        if len(rest) == 1 and len(dtypes) == 1:
            return dtypes[0] if dtypes[0].is_floating_point else False
        return False
    return None


def _is_shape_op(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in _SHAPE_METHODS:
        return True
    return node.op == "call_function" and node.target in _SHAPE_FUNCTIONS


def _slices_token_dims(node: fx.Node) -> bool:
    """``logits[i, j, :]``-style indexing: slices (no steps) of leading dims, the last kept."""
    if not (node.op == "call_function" and node.target is operator.getitem):
        return False
    index = node.args[1]
    value = _value(node.args[0])
    if not isinstance(index, tuple) or value is None:
        return False
    if Ellipsis in index or any(i is None for i in index):
        return False
    if not all(isinstance(i, slice) and i.step in (None, 1) for i in index):
        return False
    return len(index) < value.dim() or index[-1] == slice(None, None, None)


def _bind_cross_entropy(node: fx.Node) -> dict[str, Any] | None:
    try:
        bound = _SIGNATURES[node.target].bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.setdefault("label_smoothing", 0.0)  # nll_loss has none
    return arguments


def _log_softmax_input(node: Any) -> fx.Node | None:
    """x of ``log_softmax(x, dim=-1)`` (no dtype, the class dimension last of a 2-D x)."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.target in _LOG_SOFTMAXES:
        # F.log_softmax(input, dim, _stacklevel, dtype); torch.log_softmax(input, dim, dtype)
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dtype_at = 3 if node.target is F.log_softmax else 2
        dtype = node.args[dtype_at] if len(node.args) > dtype_at else node.kwargs.get("dtype")
    elif node.op == "call_method" and node.target == "log_softmax":
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dtype = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")
    else:
        return None
    x = node.args[0]
    value = _value(x)
    if dtype is not None or not isinstance(x, fx.Node) or value is None or value.dim() != 2:
        return None
    return x if dim in (-1, 1) else None


SITE_KINDS = ("loss", "mlp")


def find_split_sites(gm: fx.GraphModule, kinds: Sequence[str] = ("loss",)
                     ) -> tuple[list[Any], list[LeftAlone]]:
    """Every site of the given kinds ``split_token_wise`` can rewrite, and every candidate it
    cannot, with the reason: "loss" (the default), LM-head-and-cross-entropy chains
    (``SplitSite``), found at each cross_entropy; "mlp", token-wise MLPs (``MlpSplitSite``),
    found at each activation that reads a projection. Loss sites come first; an MLP sharing
    a node with a loss site, or with an MLP before it, is left alone."""
    if isinstance(kinds, str):
        raise ValueError(f"split site kinds: a sequence of names, e.g. ({kinds!r},), not "
                         f"{kinds!r}")
    if any(k not in SITE_KINDS for k in kinds):
        raise ValueError(f"split site kinds {tuple(kinds)!r}: valid are {', '.join(SITE_KINDS)}")
    sites: list[Any] = []
    left: list[LeftAlone] = []
    autocast = any(n.op == "call_function" and n.target in _AUTOCAST_TARGETS
                   for n in gm.graph.nodes)
    if "loss" in kinds:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in _CROSS_ENTROPIES:
                found = _match(node, autocast)
                if isinstance(found, SplitSite):
                    sites.append(found)
                else:
                    left.append(LeftAlone(node.name, found))
    if "mlp" in kinds:
        taken: dict[fx.Node, str] = {}
        for site in sites:
            for node in site.chain:
                taken[node] = f"loss split site {site.loss}"
        for anchor, mlp in _find_mlps(gm, autocast):
            if isinstance(mlp, str):
                left.append(LeftAlone(anchor.name, mlp, "mlp"))
                continue
            shared = [n for n in mlp.chain if n in taken]
            if shared:
                left.append(LeftAlone(anchor.name, f"{shared[0].name} is part of "
                                      f"{taken[shared[0]]}: sites may not overlap", "mlp"))
                continue
            for node in mlp.chain:
                taken[node] = f"the MLP split site {mlp.down}"
            sites.append(mlp)
    return sites, left


def _match(loss: fx.Node, autocast: bool) -> SplitSite | str:
    args = _bind_cross_entropy(loss)
    if args is None:
        return "arguments not understood"
    if autocast:
        return "inside an autocast region"
    if args["weight"] is not None:
        return "class weights"
    if args["size_average"] is not None or args["reduce"] is not None:
        return "legacy size_average/reduce arguments"
    reduction, ignore, smoothing = args["reduction"], args["ignore_index"], args["label_smoothing"]
    if reduction not in chunked_loss.REDUCTIONS:
        return f"reduction {reduction!r} (mean and sum are split)"
    if not isinstance(ignore, int) or not isinstance(smoothing, (int, float)):
        return "ignore_index or label_smoothing is not a constant"
    logits, target = args["input"], args["target"]
    tail: list[fx.Node] = []  # nll_loss: its log_softmax, removed with the chain
    if loss.target is F.nll_loss:
        scores = _log_softmax_input(logits)
        if scores is None:
            return "nll_loss of something other than log_softmax(logits, dim=-1)"
        if len(logits.users) != 1:
            return f"{logits.name} is read by more than the loss"
        tail, logits = [logits], scores
    value, target_value = _value(logits), _value(target)
    if not isinstance(logits, fx.Node) or not isinstance(target, fx.Node) or value is None \
            or target_value is None:
        return "input or target not traced with a value"
    if value.dim() != 2 or target_value.dim() != 1 or target_value.dtype.is_floating_point:
        return (f"logits {tuple(value.shape)} and target {tuple(target_value.shape)}: split "
                f"takes [tokens, vocab] logits and [tokens] class indices")
    compute = value.dtype
    chain: list[fx.Node] = []
    node = logits
    while True:
        if len(node.users) != 1:
            readers = ", ".join(sorted(u.name for u in node.users))
            return f"{node.name} is read by {readers}: the loss must be its only reader"
        if node.op == "call_function" and node.target in _LINEARS:
            break
        if node.op == "placeholder":  # the head ran in an earlier graph: say so, not "between"
            return (f"{node.name} is an input of this graph: the projection is in another "
                    "(a graph break between the projection and the loss)")
        cast = _cast_dtype(node)
        if cast is False:
            return f"{node.name}: a cast split does not follow"
        if cast is None and not _is_shape_op(node) and not _slices_token_dims(node):
            return f"{node.name} ({node.target}) between the projection and the loss"
        if _is_shape_op(node) and node.target != "contiguous":
            out, before = _value(node), _value(node.args[0])
            if out is None or before is None or out.shape[-1] != before.shape[-1] or not (
                    out.dim() == 2 or tuple(out.shape) == tuple(before.shape)):
                return f"{node.name}: a reshape other than flattening the token dims"
        chain.append(node)
        parent = node.args[0]
        if not isinstance(parent, fx.Node):
            return f"{node.name} reads no traced tensor"
        node = parent
    linear = node
    hidden, weight = linear.args[0], linear.args[1]
    bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
    if not isinstance(hidden, fx.Node) or not isinstance(weight, fx.Node):
        return "the projection's inputs are not traced tensors"
    h_value, w_value, out_value = _value(hidden), _value(weight), _value(linear)
    if h_value is None or w_value is None or w_value.dim() != 2 or out_value is None:
        return "the projection's inputs are not traced tensors"
    if not (h_value.dtype == w_value.dtype == out_value.dtype) or \
            (isinstance(bias, fx.Node) and _value(bias).dtype != h_value.dtype):
        return "the projection mixes dtypes"
    if value.shape[1] != w_value.shape[0]:
        return f"the loss's classes ({value.shape[1]}) are not the projection's outputs"
    if not compute.is_floating_point or compute not in (torch.float32, torch.float64,
                                                        torch.bfloat16, torch.float16):
        return f"loss dtype {compute}"
    return SplitSite(loss.name, linear.name, _hint(value.shape[0]), _hint(w_value.shape[0]),
                     compute, reduction, ignore, float(smoothing), hidden, weight,
                     bias if isinstance(bias, fx.Node) else None, target,
                     (linear, *reversed(chain), *tail), out_value.dtype)


# ---- the MLP ----------------------------------------------------------------------------------

# Activations as a torch-level graph records them: target -> name (gelu: by its approximate).
_ACTIVATION_FUNCTIONS: dict[Any, str] = {
    F.silu: "silu", torch.ops.aten.silu.default: "silu",
    F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.relu_: "relu",
    torch.ops.aten.relu.default: "relu",
    F.gelu: "gelu", torch.ops.aten.gelu.default: "gelu"}
_ACTIVATION_METHODS = {"relu": "relu", "relu_": "relu"}
_MULS = (operator.mul, torch.mul, torch.ops.aten.mul.Tensor)
# Projections not written as a linear: reported, not matched (GPT-2's Conv1D is an addmm).
_OTHER_PROJECTIONS = (torch.addmm, torch.ops.aten.addmm.default)


def _activation(node: fx.Node) -> str | None:
    """The chunked_mlp name of the activation ``node`` computes of its first argument, or
    None (not one of ours; a gelu whose approximate is not a constant we know)."""
    if node.op == "call_method" and node.target in _ACTIVATION_METHODS and len(node.args) == 1 \
            and not node.kwargs:
        return _ACTIVATION_METHODS[str(node.target)]
    if node.op != "call_function" or node.target not in _ACTIVATION_FUNCTIONS or not node.args:
        return None
    name = _ACTIVATION_FUNCTIONS[node.target]
    if name != "gelu":
        return name  # silu / relu: an ``inplace`` flag changes nothing once matched
    approximate = node.args[1] if len(node.args) > 1 else node.kwargs.get("approximate", "none")
    return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate) \
        if isinstance(approximate, str) else None


def _is_linear(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in _LINEARS


def _linear_parts(node: fx.Node) -> tuple[Any, Any, Any]:
    """(input, weight, bias) of a linear node."""
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    return (node.args[0] if node.args else node.kwargs.get("input")), weight, bias


def _readers(node: fx.Node) -> str:
    return ", ".join(sorted(u.name for u in node.users)) or "nothing"


def _find_mlps(gm: fx.GraphModule, autocast: bool
               ) -> list[tuple[fx.Node, MlpSplitSite | str]]:
    """Each candidate MLP in run order: (its activation node or other projection, the site or
    why not). A candidate is an activation reading a projection, or an expanding projection
    by addmm (reported only)."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    found: list[tuple[fx.Node, MlpSplitSite | str]] = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _OTHER_PROJECTIONS:
            weight = _value(node.args[2]) if len(node.args) > 2 else None
            if weight is not None and weight.dim() == 2 and weight.shape[1] >= 2 * weight.shape[0]:
                found.append((node, f"{node.name}: a projection by addmm (as GPT-2's Conv1D), "
                                    "not a linear: the MLP split matches linear chains"))
            continue
        name = _activation(node)
        if name is None:
            continue
        pre = node.args[0]
        if not _is_linear(pre):
            continue  # not an MLP's activation (a norm's, a convolution's ...)
        found.append((node, "inside an autocast region" if autocast
                      else _match_mlp(node, name, order)))
    return found


def _match_mlp(act: fx.Node, name: str, order: dict[fx.Node, int]) -> MlpSplitSite | str:
    pre = act.args[0]
    assert isinstance(pre, fx.Node)
    if len(act.users) != 1:
        return f"{act.name} is read by {_readers(act)}: the down projection must be its only reader"
    (user,) = act.users
    up, gate, mul = pre, None, None
    if user.op == "call_function" and user.target in _MULS and len(user.args) == 2 \
            and not user.kwargs:
        mul = user
        other = user.args[1] if user.args[0] is act else user.args[0]
        if not isinstance(other, fx.Node) or not _is_linear(other) or other is act:
            return (f"{mul.name}: the activation multiplies {getattr(other, 'name', other)}, "
                    "not a projection of the same input")
        up, gate = other, pre
        if len(mul.users) != 1:
            return (f"{mul.name} is read by {_readers(mul)}: the down projection must be its "
                    "only reader")
        (down,) = mul.users
    else:
        down = user
    intermediate = mul if mul is not None else act
    if not _is_linear(down) or _linear_parts(down)[0] is not intermediate:
        return (f"{intermediate.name} is read by {down.name} ({down.target}): the down "
                "projection (a linear) must be its only reader")
    for projection, reader in ((gate, act), (up, mul if mul is not None else act)):
        if projection is not None and (len(projection.users) != 1
                                       or next(iter(projection.users)) is not reader):
            return (f"{projection.name} is read by {_readers(projection)}: the MLP must be its "
                    "only reader")
    x, up_w, up_b = _linear_parts(up)
    gate_w = gate_b = None
    if gate is not None:
        gate_x, gate_w, gate_b = _linear_parts(gate)
        if gate_x is not x:
            return f"{gate.name} and {up.name} project different inputs"
    _, down_w, down_b = _linear_parts(down)
    nodes = (x, up_w, up_b, gate_w, gate_b, down_w, down_b)
    if any(n is not None and not isinstance(n, fx.Node) for n in nodes) or \
            any(n is not None and _value(n) is None for n in nodes):
        return "the projections' inputs are not traced tensors"
    xv, uw, dw = _value(x), _value(up_w), _value(down_w)  # checked traced above
    gw = _value(gate_w) if gate_w is not None else None
    if xv.dim() < 2 or uw.dim() != 2 or dw.dim() != 2 or (gw is not None and gw.dim() != 2):
        return (f"x {tuple(xv.shape)}: the MLP split takes x [..., dim] (the leading dims "
                "tokens) and 2-D weights")
    dtypes = {_value(n).dtype for n in (*nodes, up, down, act) if n is not None}
    if len(dtypes) != 1:
        return f"the MLP mixes dtypes ({', '.join(sorted(str(d) for d in dtypes))})"
    dtype = xv.dtype
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return f"dtype {dtype}"
    tokens = 1
    for size in xv.shape[:-1]:
        tokens *= _hint(size)
    if tokens < 2:
        return f"{tokens} token(s): fewer than two chunks' worth"
    chain = tuple(sorted((n for n in (gate, act, up, mul, down) if n is not None),
                         key=order.__getitem__))
    return MlpSplitSite(down.name, name, gate is not None, tokens, _hint(xv.shape[-1]),
                        _hint(uw.shape[0]), _hint(dw.shape[0]), dtype, x, up_w, up_b, gate_w,
                        gate_b, down_w, down_b, chain)


def split_token_wise(gm: fx.GraphModule, chunks: int | Sequence[int],
                     sites: Sequence[SplitSite | MlpSplitSite] | None = None,
                     mode: str = "forward_grads") -> list[SplitDecision]:
    """Rewrite ``gm`` in place: each site (all loss sites found, by default; MLP sites when
    given) into ``chunks`` chunks (one count, or one per site; 1 leaves a site whole), a loss
    site's gradients made as ``mode`` says (SPLIT_MODES; an MLP's are always recomputed in
    the backward). Returns what was done, one decision per site in the order given."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"split mode {mode!r}: valid are {', '.join(SPLIT_MODES)}")
    if sites is None:
        sites = find_split_sites(gm)[0]
    counts = [chunks] * len(sites) if isinstance(chunks, int) else list(chunks)
    if len(counts) != len(sites):
        raise ValueError(f"{len(counts)} chunk counts for {len(sites)} split sites")
    decisions = []
    seen: dict[fx.Node, str] = {}
    for site, count in zip(sites, counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"chunks must be an int >= 1, got {count!r}")
        for node in site.chain:
            if node in seen:
                raise ValueError(f"split sites {seen[node]} and {site.loss} share {node.name}")
            seen[node] = site.loss
        if isinstance(site, MlpSplitSite):
            site_mode = "recompute"
        else:
            site_mode = mode if _needs_grad(site) else "recompute"
        decisions.append(SplitDecision(site, count, site_mode))
    # The last site first: one reading another's output (an MLP's, back to back) is rewritten
    # while that output's node still exists; the earlier rewrite then moves its readers.
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for decision in sorted((d for d in decisions if d.chunks > 1),
                           key=lambda d: -order[d.site.chain[-1]]):
        site = decision.site
        if isinstance(site, MlpSplitSite):
            _rewrite_mlp(gm, site, decision.chunks)
        else:
            _rewrite(gm, site, decision.chunks, decision.mode)
    for decision in decisions:
        if decision.chunks > 1:
            log.info("split %s into %d chunks (%s)", decision.site.loss, decision.chunks,
                     decision.mode)
    if any(d.chunks > 1 for d in decisions):
        gm.graph.lint()
        gm.recompile()
    return decisions


def _rewrite_mlp(gm: fx.GraphModule, site: MlpSplitSite, chunks: int) -> None:
    graph = gm.graph
    down = site.chain[-1]
    with graph.inserting_before(down):
        call = graph.call_function(
            chunked_mlp.CHUNKED_OPS[0],  # token_mlp
            (site.x, site.up_weight, site.up_bias, site.gate_weight, site.gate_bias,
             site.down_weight, site.down_bias, site.activation, chunks))
    if _value(down) is not None:
        call.meta["example_value"] = _value(down)
    down.replace_all_uses_with(call)
    for node in reversed(site.chain):  # the down projection first: each one's reader is gone
        graph.erase_node(node)


def _needs_grad(site: SplitSite) -> bool:
    """Whether the logits need a gradient (traced with grad mode on, something trainable)."""
    return bool(getattr(_value(site.chain[0]), "requires_grad", False))


def _rewrite(gm: fx.GraphModule, site: SplitSite, chunks: int, mode: str) -> None:
    graph = gm.graph
    loss = next(n for n in graph.nodes if n.name == site.loss)
    with graph.inserting_before(loss):
        # The hidden states indexed as the logits are (the class dim kept last throughout).
        hidden: fx.Node = site.hidden
        for node in site.chain[1:]:
            if node.op == "call_function" and node.target is operator.getitem:
                hidden = graph.call_function(operator.getitem, (hidden, node.args[1]))
            elif _is_shape_op(node) and node.target != "contiguous" \
                    and _value(node).dim() == 2:
                hidden = graph.call_method("flatten", (hidden, 0, -2))
        hidden = graph.call_method("flatten", (hidden, 0, -2))
        target = graph.call_method("reshape", (site.target, -1))
        op = (torch.ops.aot_partition.linear_cross_entropy_with_grads.default
              if mode == "forward_grads" else torch.ops.aot_partition.linear_cross_entropy.default)
        call = graph.call_function(
            op,
            (hidden, site.weight, site.bias, target, site.ignore_index, site.reduction,
             site.label_smoothing, chunked_loss.dtype_name(site.dtype), chunks))
        result = graph.call_function(operator.getitem, (call, 0))
    if _value(loss) is not None:
        result.meta["example_value"] = _value(loss)
    loss.replace_all_uses_with(result)
    graph.erase_node(loss)
    for node in reversed(site.chain):  # the loss's input first: each one's only user is gone
        graph.erase_node(node)
