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
dtype; an autocast region in the graph (the op would not see autocast's dtype choices).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import chunked_loss

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


# How the gradients are made: "forward_grads" (each chunk's gradient computed while its logits
# exist, in the forward; the backward scales them: no matmul more than unsplit, the [tokens,
# dim] and [vocab, dim] gradients kept from forward to backward) or "recompute" (the forward
# keeps each token's log-sum-exp; the backward recomputes each chunk's logits: one matmul
# more). Without gradients to make (inference), the forward computes the loss only.
SPLIT_MODES = ("forward_grads", "recompute")


@dataclasses.dataclass(frozen=True)
class SplitDecision:
    """What ``split_token_wise`` did at one site (``chunks`` 1: left whole)."""

    site: SplitSite
    chunks: int
    mode: str = "forward_grads"

    def describe(self) -> str:
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
    """A cross_entropy the split does not rewrite, and why."""

    loss: str
    reason: str


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


def find_split_sites(gm: fx.GraphModule) -> tuple[list[SplitSite], list[LeftAlone]]:
    """Every LM-head-and-cross-entropy chain ``split_token_wise`` can rewrite, and every
    cross_entropy it cannot, with the reason."""
    sites: list[SplitSite] = []
    left: list[LeftAlone] = []
    autocast = any(n.op == "call_function" and n.target in _AUTOCAST_TARGETS
                   for n in gm.graph.nodes)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _CROSS_ENTROPIES:
            found = _match(node, autocast)
            if isinstance(found, SplitSite):
                sites.append(found)
            else:
                left.append(LeftAlone(node.name, found))
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


def split_token_wise(gm: fx.GraphModule, chunks: int | Sequence[int],
                     sites: Sequence[SplitSite] | None = None,
                     mode: str = "forward_grads") -> list[SplitDecision]:
    """Rewrite ``gm`` in place: each site (all found, by default) into ``chunks`` chunks (one
    count, or one per site; 1 leaves a site whole), its gradients made as ``mode`` says
    (SPLIT_MODES). Returns what was done."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"split mode {mode!r}: valid are {', '.join(SPLIT_MODES)}")
    if sites is None:
        sites = find_split_sites(gm)[0]
    counts = [chunks] * len(sites) if isinstance(chunks, int) else list(chunks)
    if len(counts) != len(sites):
        raise ValueError(f"{len(counts)} chunk counts for {len(sites)} split sites")
    decisions = []
    for site, count in zip(sites, counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"chunks must be an int >= 1, got {count!r}")
        site_mode = mode if _needs_grad(site) else "recompute"
        if count > 1:
            _rewrite(gm, site, count, site_mode)
            log.info("split %s into %d chunks (%s)", site.loss, count, site_mode)
        decisions.append(SplitDecision(site, count, site_mode))
    if any(d.chunks > 1 for d in decisions):
        gm.graph.lint()
        gm.recompile()
    return decisions


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
