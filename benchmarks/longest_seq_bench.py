"""Longest sequence that fits, SIMULATED: Llama-3-8B training steps on an 80 GB device.

SIMULATED, not measured (issue 39, item 4): transformers' ``LlamaForCausalLM`` with Llama-3-8B's
shapes (hidden 4096, 32 layers, 32 heads, 8 KV heads, SwiGLU 14336, vocab 128,256, RMSNorm,
RoPE; attention by SDPA with GQA) is built under a FakeTensorMode (no memory), batch 1, bf16
weights, and its training step (forward, the loss in fp32, backward) traced by AOTAutograd at
one STATIC sequence length. The joint graph is partitioned by the variant and both graphs are
lowered by the compiled-program memory model (``aot_partition.memory_models.inductor``: Inductor's
own lowering, fusion and memory plan; Inductor's CPU lowering, since a GPU's needs a GPU). The
whole 32-layer step is modelled at that length: nothing is extrapolated from fewer layers and
nothing is replayed at another length (a program lowered at one length and replayed at another
keeps some sizes at the first length, e.g. the split ops' scratch: that gave impossible answers).

The longest length, per variant and capacity (``Bench.run``):

1. model the step at two fit lengths (``FIT``, near the expected answer) and draw the line
   total(S) = a + b S through them (batch 1: activations, attention and logits grow linearly in
   S; the weights, the optimizer state and the gradients do not);
2. predict the longest multiple of 1024 under the capacity;
3. verify: model that length (it must fit) and 1024 more (it must not). When the prediction is
   off (the cut at budget 0.5 moves with the length, so the total bends), the line through the
   two models that bracket the capacity predicts again, inside the bracket, until the longest
   fitting length and the next multiple of 1024 are both modelled (``next_length``). The row
   reports the verified length, the first linear prediction, every length modelled and how
   many distinct cuts (saved sets) they chose.

Variants: torch's min-cut partitioner at activation_memory_budget 0.5 and 0.0; ours with the
split (the LM head + cross-entropy in chunks of tokens, ``linear_cross_entropy_with_grads``;
with ``loss+mlp`` also each MLP in chunks, ``token_mlp``, where that op is registered), one chunk
per 1024 tokens, at most 64 (``chunks_for``). Ours without a split is checked once (``--same-cut``,
8,192 tokens) to save exactly torch's set at each budget; its rows are torch's then.

What one step holds (``total``):

- static, before the step: bf16 weights (8.03e9 parameters, 16.06 GB) and AdamW's m and v in
  bf16 (pure-bf16 AdamW, as torchtitan / MsT-style setups run it: 32.12 GB). fp32 master weights
  with fp32 m and v would be 12 B a parameter, 96.4 GB: more than the device before any
  activation, so that setup is not modelled;
- the step as the memory model plays it: inputs, saved activations, temporaries, the split
  ops' scratch (from their shapes: one chunk's logits, the LM head's gradient accumulated in fp32,
  the MLP chunk's intermediates) and the bf16 gradients as the compiled backward returns them
  (``zero_grad(set_to_none=True)``, PyTorch's default: a gradient exists from the backward kernel
  that makes it to the optimizer step; with ``.grad`` buffers kept across steps a compiled
  backward's fresh gradients coexist with them, +16 GB);
- not counted: the CUDA context, cuBLAS and attention library scratch (FlashAttention-2's
  forward keeps O(tile) scratch; its backward's fp32 dQ accumulator, S x 4096 x 4 bytes, about
  1 GiB at 64k tokens, is not in the model), allocator fragmentation. Hence two capacities:
  80 GB raw (80e9 bytes) and 76 GB (5% kept for those).

``decomposition_check`` (the earlier run's layer-count check: the peak is affine in the layer
count, the saved-based extrapolation is not; tested on a tiny Llama) is kept, not run by ``main``.

Step time: the roofline estimate (``aot_partition.costs.roofline``, H100 numbers) summed over the
two graphs at the longest length, FX ops unfused (attention priced as dense, not causal).

Each 32-layer model takes minutes on a loaded CPU, so the variants run as workers that each
write ``out/longest_seq_w_TAG.json`` after every model and merge all workers' rows into the
report after every row:

    uv run --locked python benchmarks/longest_seq_bench.py --results --tag t --same-cut \\
        --variants torch@0.5,torch@0.0
    uv run --locked python benchmarks/longest_seq_bench.py --results --tag s \\
        --variants "ours split(loss) @0.5"
    uv run --locked python benchmarks/longest_seq_bench.py --results --report  # merge only
    uv run --locked python benchmarks/longest_seq_bench.py --quick   # a small Llama, 4 layers
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
GB = 10**9
GIB = 2**30
STEP = 1024  # sequence lengths searched: multiples of this

LLAMA3_8B: dict[str, Any] = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "tie_word_embeddings": False}
# The decomposition check's model (small enough to lower 8 layers many times).
SMALL: dict[str, Any] = {**LLAMA3_8B, "hidden_size": 256, "intermediate_size": 896,
                         "num_hidden_layers": 8, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "vocab_size": 8192}
# --quick: the same small Llama at 4 layers, its device scaled down.
QUICK: dict[str, Any] = {**SMALL, "num_hidden_layers": 4}


@dataclass(frozen=True)
class Variant:
    name: str
    who: str            # "torch" (torch's min-cut partitioner) or "ours" (aot_partition)
    budget: float       # activation_memory_budget
    split: str = ""     # "", "loss" (LM head + cross-entropy in chunks), "loss+mlp"


VARIANTS = (
    Variant("torch@0.5", "torch", 0.5), Variant("torch@0.0", "torch", 0.0),
    Variant("ours@0.5", "ours", 0.5), Variant("ours@0.0", "ours", 0.0),
    Variant("ours split(loss) @0.0", "ours", 0.0, "loss"),
    Variant("ours split(loss) @0.5", "ours", 0.5, "loss"),
    Variant("ours split(loss+mlp) @0.0", "ours", 0.0, "loss+mlp"),
    Variant("ours split(loss+mlp) @0.5", "ours", 0.5, "loss+mlp"),
)


def chunks_for(seq: int, most: int = 64) -> int:
    """Chunks of the split ops: one per 1024 tokens (a chunk holds at least 1024 tokens, so
    the matmuls stay large), at most ``most``."""
    return max(1, min(most, seq // 1024))


def mlp_split_available() -> bool:
    try:
        from aot_partition.split import chunked_mlp  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch.ops.aot_partition, "token_mlp")


# ---- static memory -------------------------------------------------------------------------------

def parameter_count(spec: dict[str, Any]) -> int:
    d, f, v = spec["hidden_size"], spec["intermediate_size"], spec["vocab_size"]
    kv = d // spec["num_attention_heads"] * spec["num_key_value_heads"]
    layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    return 2 * v * d + spec["num_hidden_layers"] * layer + d


def static_bytes(spec: dict[str, Any]) -> dict[str, int]:
    n = parameter_count(spec)
    return {"parameters": n, "weights_bf16": 2 * n, "adamw_m_v_bf16": 4 * n,
            "fp32_master_m_v": 12 * n, "grads_bf16": 2 * n}


# ---- tracing -------------------------------------------------------------------------------------

class _Recorded(Exception):
    pass


@dataclass
class Traced:
    joint: fx.GraphModule
    inputs: list[Any]
    num_fwd_outputs: int
    static: list[int]
    hint: int
    seconds: float


def trace(spec: dict[str, Any], layers: int, hint: int, split: str, dynamic: bool = True,
          most_chunks: int = 64) -> Traced:
    """The step's joint graph (bf16 weights, the loss in fp32), the sequence length symbolic
    (hinted ``hint``) unless ``dynamic`` is False."""
    from aot_partition.split import chunked_loss  # noqa: F401 - registers the ops
    from functorch.compile import aot_function, make_boxed_func
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    from torch.nn.utils.stateless import _reparametrize_module
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    start = time.perf_counter()
    config = LlamaConfig(**{**spec, "num_hidden_layers": layers}, attn_implementation="sdpa")
    chunks = chunks_for(hint, most_chunks)
    record: dict[str, Any] = {}

    def recording(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  **_: Any) -> Any:
        record["joint"] = (joint, joint_inputs, num_fwd_outputs)
        raise _Recorded

    def boxed(gm: fx.GraphModule, _inputs: Any) -> Any:
        return make_boxed_func(gm)

    def split_mlp(self: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aot_partition.token_mlp(
            x, self.up_proj.weight, None, self.gate_proj.weight, None, self.down_proj.weight,
            None, "silu", chunks)

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv() if dynamic else None)
    default_dtype = torch.get_default_dtype()
    with mode:
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(default_dtype)
        params = dict(model.named_parameters())
        num_params = len(params)
        params.update(dict(model.named_buffers()))  # RoPE's inverse frequencies
    if dynamic:
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC])
        ids, labels = (mode.from_tensor(torch.zeros(1, hint, dtype=torch.long),
                                        symbolic_context=context) for _ in range(2))
    else:
        with mode:
            ids, labels = (torch.zeros(1, hint, dtype=torch.long) for _ in range(2))

    def step(params: dict[str, torch.Tensor], ids: torch.Tensor, labels: torch.Tensor
             ) -> torch.Tensor:
        with _reparametrize_module(model, params):
            hidden = model.model(input_ids=ids).last_hidden_state
        head = params["lm_head.weight"]
        if "loss" not in split:
            logits = F.linear(hidden, head).float()
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return torch.ops.aot_partition.linear_cross_entropy_with_grads(
            hidden.flatten(0, 1), head, None, labels.flatten(), -100, "mean", 0.0, "float32",
            chunks)[0]

    original = modeling_llama.LlamaMLP.forward
    if "mlp" in split:
        modeling_llama.LlamaMLP.forward = split_mlp
    try:
        with mode:
            aot_function(step, fw_compiler=boxed, bw_compiler=boxed, partition_fn=recording,
                         dynamic=dynamic)(params, ids, labels)
    except _Recorded:
        pass
    finally:
        modeling_llama.LlamaMLP.forward = original
    joint, inputs, num_fwd_outputs = record["joint"]
    for node in joint.graph.find_nodes(op="get_attr"):  # fake constants (empty) made real
        value = getattr(joint, node.target)
        setattr(joint, node.target, torch.zeros(value.shape, dtype=value.dtype))
    return Traced(joint, inputs, num_fwd_outputs, list(range(num_params)), hint,
                  time.perf_counter() - start)


def partition(traced: Traced, variant: Variant) -> tuple[fx.GraphModule, fx.GraphModule]:
    from aot_config import functorch as functorch_config
    from aot_partition import min_cut_rematerialization_partition
    from torch._functorch import config as torch_config
    from torch._functorch.partitioners import (
        min_cut_rematerialization_partition as torch_partition,
    )

    joint = copy.deepcopy(traced.joint)
    args = (joint, traced.inputs)
    kwargs = {"num_fwd_outputs": traced.num_fwd_outputs,
              "static_lifetime_input_indices": traced.static}
    if variant.who == "torch":
        with torch_config.patch(activation_memory_budget=variant.budget):
            return torch_partition(*args, **kwargs)
    with functorch_config.patch(activation_memory_budget=variant.budget):
        return min_cut_rematerialization_partition(*args, **kwargs)


def signature(fw: fx.GraphModule, bw: fx.GraphModule) -> str:
    """The cut, independent of the hint and of the symbols' names."""
    text = re.sub(r"\bs\d+\b", "S", fw.code + bw.code)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# ---- the model: static shapes at each length ----------------------------------------------------

def saved_names(fw: fx.GraphModule, num_fwd_outputs: int) -> list[str]:
    from aot_partition.fx.sizes import forward_saved_outputs

    return sorted(n.name for n in forward_saved_outputs(fw.graph, num_fwd_outputs))


def cut_id(names: list[str]) -> str:
    """The cut, by the names of what the forward saves (the same at every length)."""
    return hashlib.sha1("\n".join(names).encode()).hexdigest()[:12]


def step_ms(fw: fx.GraphModule, bw: fx.GraphModule) -> float | None:
    """The roofline estimate (H100) of both graphs, FX ops unfused, in ms."""
    from aot_partition.costs.estimators import estimate_runtime

    try:
        return 1e3 * sum(estimate_runtime(n, "roofline") for g in (fw, bw)
                         for n in g.graph.nodes if n.op == "call_function")
    except Exception as error:  # an op the estimator cannot price
        print(f"step time: {error}", file=sys.stderr)
        return None


@dataclass
class Point:
    """One static-shape model of the whole step: traced, partitioned and lowered at ``seq``."""
    variant: str
    seq: int
    chunks: int          # the split ops' chunk count at this length (0: no split)
    total: int           # bytes at the peak: weights + AdamW m, v (bf16) + the step above them
    above_weights: int
    saved: int
    grads_at_peak: int
    peak_phase: str
    peak_node: str
    cut: str
    step_ms: float | None
    seconds: float


@dataclass
class Row:
    variant: str
    capacity_gb: float
    longest: int | None          # tokens (verified if ``verified``); None: not found
    verified: bool
    fits_total_gb: float | None  # modelled total at ``longest``
    over_total_gb: float | None  # at ``longest`` + STEP
    predicted: int | None        # the linear prediction from the two fit points
    fit_points: tuple[int, int]
    slope_mb_per_token: float    # b of total(S) = a + b S, MB a token
    intercept_gb: float          # a
    measured: list[int]          # every length modelled for this variant
    cuts: int                    # distinct cuts among them
    peak_at: str
    step_ms: float | None
    seconds: float


def linear(p: Point, q: Point) -> tuple[float, float]:
    """``a, b`` of total(S) = a + b S through two points."""
    b = (q.total - p.total) / (q.seq - p.seq)
    return p.total - b * p.seq, b


def predict(a: float, b: float, capacity: int) -> int:
    """The longest multiple of STEP with a + b S <= capacity (0 if none)."""
    if b <= 0:
        return 1 << 30
    return max(0, int((capacity - a) // b) // STEP * STEP)


def bracket(points: dict[int, Point], capacity: int) -> tuple[int, int | None]:
    """The longest measured length that fits (0: none) and the shortest that does not."""
    fits = [s for s, p in points.items() if p.total <= capacity]
    over = [s for s, p in points.items() if p.total > capacity]
    return max(fits, default=0), min(over, default=None)


def next_length(points: dict[int, Point], capacity: int) -> int | None:
    """The next length to model, or None once the answer is verified (the longest fitting
    length and the next multiple of STEP both modelled). The line through the two points
    that bracket the capacity (or the two nearest it) predicts; the guess is kept strictly
    inside the bracket, so every model narrows it."""
    lo, hi = bracket(points, capacity)
    if hi is not None and hi - lo <= STEP:
        return None
    near = sorted(points.values(), key=lambda p: abs(p.total - capacity))
    pair = ([points[lo], points[hi]] if lo and hi is not None else near[:2])
    if len(pair) < 2:
        guess = 2 * max(points) if lo else max(STEP, min(points) // 2)
    else:
        guess = predict(*linear(*sorted(pair, key=lambda p: p.seq)), capacity)
    guess = max(guess, lo + STEP)
    if hi is not None:
        guess = min(guess, hi - STEP)
    return guess


def longest(fits: Callable[[int], bool], high: int) -> int:
    """The largest multiple of STEP up to ``high`` with ``fits`` (0 if none), by bisection;
    ``fits`` is monotone. (Kept for callers; the bench itself verifies a linear prediction.)"""
    lo, hi = 0, high // STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * STEP):
            lo = mid
        else:
            hi = mid - 1
    return lo * STEP


class Bench:
    def __init__(self, spec: dict[str, Any], capacities: dict[str, int], most_chunks: int = 64,
                 log: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self.capacities = capacities
        self.most_chunks = most_chunks
        self.static = static_bytes(spec)
        self.traces: dict[tuple[int, str], Traced] = {}
        self.points: dict[str, dict[int, Point]] = {}
        self.log = log or (lambda: None)

    def traced(self, seq: int, split: str) -> Traced:
        key = (seq, split)
        if key not in self.traces:
            while len(self.traces) >= 2:  # a 32-layer joint graph is large: keep two
                self.traces.pop(next(iter(self.traces)))
            self.traces[key] = trace(self.spec, self.spec["num_hidden_layers"], seq, split,
                                     dynamic=False, most_chunks=self.most_chunks)
            print(f"  traced {split or 'whole'} at {seq}: {self.traces[key].seconds:.0f} s",
                  file=sys.stderr)
        return self.traces[key]

    def measure(self, variant: Variant, seq: int) -> Point:
        """The step at ``seq`` tokens, static shapes: traced, partitioned, lowered, replayed."""
        from aot_partition.memory_models.inductor import lower_partition

        known = self.points.setdefault(variant.name, {})
        if seq in known:
            return known[seq]
        start = time.perf_counter()
        traced = self.traced(seq, variant.split)
        fw, bw = partition(traced, variant)
        names = saved_names(fw, traced.num_fwd_outputs)
        timeline = lower_partition(copy.deepcopy(fw), copy.deepcopy(bw)).timeline(
            static_input_indices=traced.static)
        peak = timeline.steps[timeline.peak_step] if timeline.steps else None
        above = timeline.peak_bytes - timeline.parameter_bytes
        point = Point(
            variant.name, seq, chunks_for(seq, self.most_chunks) if variant.split else 0,
            timeline.parameter_bytes + self.static["adamw_m_v_bf16"] + above, above,
            timeline.saved_bytes, peak.high_by_kind.get("gradient", 0) if peak else 0,
            timeline.peak_phase, str(timeline.peak_node), cut_id(names), step_ms(fw, bw),
            time.perf_counter() - start)
        known[seq] = point
        print(f"  {variant.name} @ {seq}: total {point.total / GB:.2f} GB (saved "
              f"{point.saved / GB:.2f}, peak {point.peak_phase} {point.peak_node}, cut "
              f"{point.cut}) {point.seconds:.0f} s", file=sys.stderr)
        self.log()
        return point

    def run(self, variant: Variant, fit: tuple[int, int], most_models: int = 5) -> list[Row]:
        """Fit total(S) = a + b S at the two ``fit`` lengths, predict each capacity's longest
        length, then model lengths (see ``next_length``) until the answer is verified: it
        fits, the next multiple of STEP does not; at most ``most_models`` more per capacity."""
        start = time.perf_counter()
        first, second = (self.measure(variant, s) for s in fit)
        a, b = linear(first, second)
        rows = []
        for cap in self.capacities.values():
            predicted = predict(a, b, cap)
            points = self.points[variant.name]
            for _ in range(most_models):
                seq = next_length(points, cap)
                if seq is None:
                    break
                self.measure(variant, seq)
            lo, hi = bracket(points, cap)
            verified = hi is not None and hi - lo <= STEP
            here = points.get(lo)
            rows.append(Row(
                variant.name, cap / GB, lo if verified else None, verified,
                here.total / GB if here else None,
                points[hi].total / GB if verified and hi in points else None,
                predicted, fit, b / 1e6, a / GB, sorted(points),
                len({p.cut for p in points.values()}),
                f"{here.peak_phase} `{here.peak_node}`" if here else "-",
                here.step_ms if here else None, time.perf_counter() - start))
            print(f"ROW {variant.name} @{cap / GB:.0f} GB: longest {rows[-1].longest} "
                  f"(verified {verified}; linear prediction {predicted}; bracket {lo}..{hi})",
                  file=sys.stderr)
        return rows


# ---- the decomposition check ---------------------------------------------------------------------

def decomposition_check(spec: dict[str, Any], seq: int, variants: tuple[Variant, ...],
                        layers: int) -> list[dict[str, Any]]:
    """Direct ``layers``-layer model against two extrapolations from fewer layers (static
    shapes): (a) the saved/transient decomposition, 1 and 2 layers: the peak above the weights
    at 2 layers plus (layers - 2) x the saved bytes a layer adds; (b) the peak itself affine in
    the layer count, 2 and 4 layers."""
    from aot_partition.memory_models.inductor import simulate_compiled_partition

    rows = []
    for variant in variants:
        points: dict[int, tuple[int, int]] = {}
        for count in sorted({1, 2, 4, layers}):
            traced = trace({**spec, "num_hidden_layers": count}, count, seq, variant.split,
                           dynamic=False)
            fw, bw = partition(traced, variant)
            timeline = simulate_compiled_partition(copy.deepcopy(fw), copy.deepcopy(bw),
                                                   static_input_indices=traced.static,
                                                   workspace=False)
            points[count] = (timeline.peak_bytes - timeline.parameter_bytes,
                             timeline.saved_bytes)
        per_layer_saved = points[2][1] - points[1][1]
        by_saved = points[2][0] + (layers - 2) * per_layer_saved
        slope = (points[4][0] - points[2][0]) / 2
        by_peak = points[4][0] + (layers - 4) * slope
        direct = points[layers][0]
        rows.append({"variant": variant.name, "seq": seq, "layers": layers,
                     "direct_mib": direct / 2**20,
                     "saved_per_layer_mib": per_layer_saved / 2**20,
                     "by_saved_mib": by_saved / 2**20,
                     "by_saved_error": by_saved / direct - 1,
                     "peak_per_layer_mib": slope / 2**20,
                     "by_peak_mib": by_peak / 2**20, "by_peak_error": by_peak / direct - 1,
                     "saved_direct_mib": points[layers][1] / 2**20})
        print(f"  check {rows[-1]}", file=sys.stderr)
    return rows


# ---- the report ----------------------------------------------------------------------------------

FIT = {"torch@0.5": (8192, 12288), "torch@0.0": (4096, 8192),
       "ours split(loss) @0.5": (16384, 32768), "ours split(loss) @0.0": (4096, 8192),
       "ours split(loss+mlp) @0.5": (16384, 32768), "ours split(loss+mlp) @0.0": (4096, 8192)}
QUICK_FIT = (2048, 4096)


NOTES = """
**Target (ours >= 2x torch's longest): met, by the split with the MLP in chunks.** Ours
split(loss+mlp) at budget 0.5 fits 27,648 tokens at 80 GB and 23,552 at 76 GB: 3.38x / 3.29x
torch@0.5 (8,192 / 7,168) and 6.75x / 5.75x torch@0.0 (4,096 / 4,096). The loss split alone does
not meet it (1.00x / 1.14x torch@0.5), and ours without a split makes torch's cuts (1.00x).
All of it is a model on a CPU, not a GPU measurement (see below for what is not counted).

### Notes

- **Method.** Each row comes from static-shape models of the whole 32-layer step (no replay, no
  extrapolation in the layer count). Two fit lengths give a line total(S) = a + b S; its
  prediction is verified by modelling the predicted length (it must fit) and 1,024 more (it must
  not), re-predicting inside the bracket when it is off. The earlier version lowered one cut at
  a hint and replayed it at other lengths: the lowered program kept some sizes at the hint
  (the split ops' scratch among them), which gave the impossible split rows (nothing at 1,024
  tokens, everything at 512k) and moved torch@0.5 to 9,216 (static models: 80.56 GB there).
- **Split ops.** One chunk per 1,024 tokens, at most 64. The split ops' scratch comes from their
  shapes (`chunked_loss` / `chunked_mlp.workspace_bytes`): the bench sets the memory model's
  run-it-to-measure limit to 0, because running the 8B MLP chunk on random CPU tensors took
  minutes a run. `token_mlp` matched the plain SwiGLU MLP in float64 (forward and all four
  gradients, 300 tokens in 7 chunks) before it was used.
- **The cut moves with the length at budget 0.5.** torch@0.5 chose three different saved sets at
  7,168-8,192, 9,216 and 12,288 tokens, split(loss)@0.5 three at 8,192, 9,216 and 16,384: the
  total bends, and the first linear prediction at 80 GB was one step too long for both (9,216;
  verified 8,192). Budget 0.0 and split(loss+mlp)@0.5 kept one cut at every length modelled.
- **Ours without a split = torch.** At 8,192 tokens ours@0.5 saves exactly torch@0.5's set (513
  values) and ours@0.0 torch@0.0's (294 values: only the inputs, 0 bytes beyond them); their
  rows are torch's.
- **Budget 0.0 is worse than 0.5** (4,096 against 8,192 at 80 GB): nothing is saved, so the
  backward recomputes each layer's forward and holds what the later layers' backward needs; the
  modelled step grows about 6.0 MB a token (0.5: 3.2-4.3 MB a token between 7k and 12k).
- **split(loss) alone does not help at this size.** At 0.5 it takes 3.3 GB off at 8,192 tokens
  (72.87 against 76.20 GB) but the next 1,024 tokens (a new cut) cost 7.9 GB: 8,192 at 80 GB
  (as torch), 8,192 at 76 GB (torch 7,168). At 0.0 it is worse than torch (4,096 / 3,072 against
  4,096 / 4,096): the line's intercept is 3.2 GB higher (53.4 against 50.3 GB: about the split
  op's fixed scratch by its shapes, the LM head's gradient in fp32, 2.1 GB, and one 1,024-token
  chunk of fp32 logits and their gradient, 0.5 GB each) and its slope only 0.5 MB a token lower
  (5.5 against 6.0), so it would win only past about 6,300 tokens, where neither fits.
- **split(loss+mlp)@0.5 is what reaches the target.** With each MLP also computed in token
  chunks (`token_mlp` saves its input, not the 14,336-wide intermediates), the saved bytes fall to
  about 1.0 MB a token (20.18 GB at 20,480) and the step grows about 0.94 MB a token between
  16,384 and 20,480 and exactly that (0.94 MB a token) on to 28,672: the four verification
  models fell on the line. At 12,288 the peak is in the backward, from 16,384 on at the end of
  the forward (so the line through 12,288 and 20,480 would have said 29,696: the fit lengths
  were 16,384 and 20,480, both past the bend).
- **Not counted:** the CUDA context (about 0.5-1 GB), cuBLAS workspaces, FlashAttention's
  backward dQ accumulator in fp32 (S x 4096 x 4 bytes: 0.45 GB at 27k tokens) and other library
  scratch, allocator fragmentation: the 76 GB column keeps 5% for them. The memory model lowers
  with Inductor's CPU lowering (a GPU's may fuse and plan differently); the attention traces to
  `aten._scaled_dot_product_flash_attention_for_cpu` (and its backward): O(S) memory, no S x S
  matrix, as a GPU's FlashAttention would be; its kernels' own scratch is not counted.
- **Not modelled:** fp32 master weights + fp32 m and v (96.4 GB alone), `.grad` kept across
  steps (+16 GB), activation offloading, tensor/sequence parallelism.
"""


def same_cut_check(bench: Bench, seq: int, pairs: list[tuple[Variant, Variant]]
                   ) -> list[dict[str, Any]]:
    """Whether ours (no split) saves exactly what torch saves, at ``seq`` tokens (static)."""
    out = []
    for ours, theirs in pairs:
        traced = bench.traced(seq, "")
        names = [saved_names(partition(traced, v)[0], traced.num_fwd_outputs)
                 for v in (ours, theirs)]
        out.append({"ours": ours.name, "torch": theirs.name, "seq": seq,
                    "equal": names[0] == names[1], "saved_values": len(names[1]),
                    "cut": cut_id(names[1])})
        print(f"  same cut {ours.name} / {theirs.name} at {seq}: {out[-1]}", file=sys.stderr)
    return out


def markdown(rows: list[dict[str, Any]], same: list[dict[str, Any]], meta: dict[str, Any]
             ) -> str:
    static = meta["static_bytes"]
    caps = sorted({r["capacity_gb"] for r in rows}, reverse=True) or [80.0, 76.0]
    by = {(r["variant"], r["capacity_gb"]): r for r in rows}
    names = list(dict.fromkeys(r["variant"] for r in rows))
    copies = {s["ours"]: s for s in same if s["equal"]}

    def cell(name: str, cap: float) -> str:
        r = by.get((name, cap))
        if r is None:
            return "-"
        return f"{r['longest']:,}" if r["verified"] else "not verified"

    def ratio(name: str, base: str) -> str:
        out = []
        for cap in caps:
            r, b = by.get((name, cap)), by.get((base, cap))
            ok = r and b and r["verified"] and b["verified"] and b["longest"]
            out.append(f"{r['longest'] / b['longest']:.2f}x" if ok else "n/a")
        return " / ".join(out)

    lines = [
        f"## Longest sequence that fits, SIMULATED ({meta['model']}, batch 1, bf16, "
        f"AdamW, {caps[0]:.0f} GB device)", "",
        f"Machine: {meta['machine']}; torch {meta['torch']}; transformers "
        f"{meta['transformers']}; {meta['date']}. **Not measured on a GPU**: every length in "
        "the table is a static-shape model of the whole 32-layer step (traced on fake tensors, "
        "partitioned by the variant, lowered by Inductor for the memory model, its CPU "
        "lowering), nothing replayed across lengths and nothing extrapolated from fewer "
        "layers; see the module doc of `benchmarks/longest_seq_bench.py`.", "",
        f"Static: {static['parameters'] / 1e9:.2f}e9 parameters; bf16 weights "
        f"{static['weights_bf16'] / GB:.2f} GB + AdamW m and v in bf16 "
        f"{static['adamw_m_v_bf16'] / GB:.2f} GB = "
        f"{(static['weights_bf16'] + static['adamw_m_v_bf16']) / GB:.2f} GB before the step; "
        f"the bf16 gradients ({static['grads_bf16'] / GB:.2f} GB) are counted as the compiled "
        "backward makes them. fp32 master weights with fp32 m and v would need "
        f"{static['fp32_master_m_v'] / GB:.1f} GB on their own: nothing fits on an 80 GB "
        "device that way, so the pure-bf16 optimizer is assumed.", "",
        "| variant | " + " | ".join(f"longest @{c:.0f} GB" for c in caps)
        + " | vs torch@0.5 | vs torch@0.0 | linear prediction | lengths modelled | cuts "
        "| total GB at longest / next | peak at | step ms (est.) | how verified |",
        "|---|" + "---:|" * len(caps) + "---:|---:|---:|---|---:|---|---|---:|---|"]
    for name in names:
        first = by.get((name, caps[0]))
        if first is None:
            continue
        last = [by[(name, c)] for c in caps if (name, c) in by][-1]
        measured, cuts = last["measured"], last["cuts"]  # the last row saw every model
        pred = " / ".join(f"{by[(name, c)]['predicted']:,}" if (name, c) in by else "-"
                          for c in caps)
        totals = (f"{first['fits_total_gb']:.2f} / {first['over_total_gb']:.2f}"
                  if first["verified"] else "-")
        ms = f"{first['step_ms']:.0f}" if first.get("step_ms") is not None else "-"
        how = ("static models at the longest length (fits) and 1,024 more (over), "
               f"at each capacity; line fitted at {first['fit_points'][0]:,} and "
               f"{first['fit_points'][1]:,}" if all(by.get((name, c), {}).get("verified")
                                                    for c in caps) else "bracket not closed")
        lines.append(
            f"| {name} | " + " | ".join(cell(name, c) for c in caps)
            + f" | {ratio(name, 'torch@0.5')} | {ratio(name, 'torch@0.0')} | {pred} | "
            + ", ".join(f"{s:,}" for s in measured)
            + f" | {cuts} | {totals} | {first['peak_at']} | {ms} | {how} |")
        for ours, s in copies.items():
            if s["torch"] == name:
                lines.append(
                    f"| {ours} | " + " | ".join(cell(name, c) for c in caps)
                    + f" | {ratio(name, 'torch@0.5')} | {ratio(name, 'torch@0.0')} | - | - "
                    f"| - | - | - | - | the same cut as {name} (the saved sets are equal, "
                    f"{s['saved_values']} values, at {s['seq']:,} tokens) |")
    lines += [
        "", f"Capacities: {' and '.join(f'{c:.0f} GB' for c in caps)} (10^9 bytes). Ratios: "
        f"at {' / '.join(f'{c:.0f} GB' for c in caps)}. Linear prediction: "
        "total(S) = a + b S through the two fit lengths' models, rounded down to a multiple of "
        f"{STEP}. Lengths modelled: every static model made for the row (both capacities). "
        "Cuts: how many distinct saved sets those models chose (1: the cut does not move with "
        "the length). Total: the modelled peak at the longest length and at 1,024 more. Step: "
        "the roofline estimate (H100 numbers, FX ops unfused, attention priced dense) at the "
        "longest length.", ""]
    return "\n".join(lines) + "\n"


def _write(path: str, payload: dict[str, Any], text: str | None = None) -> None:
    for suffix, body in ((".json", json.dumps(payload, indent=2, default=str)), (".md", text)):
        if body is None:
            continue
        tmp = f"{path}{suffix}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, path + suffix)


def merge(out: str, results: bool, meta: dict[str, Any], notes: str = "") -> str:
    """Every worker's rows (``out/longest_seq_w_*.json``) in one report."""
    rows, same, points = [], [], []
    for name in sorted(os.listdir(out)):
        if name.startswith("longest_seq_w_") and name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                part = json.load(f)
            rows += part["rows"]
            same += part["same_cut"]
            points += part["points"]
    points = list({(p["variant"], p["seq"]): p for p in points}.values())
    order = {v.name: i for i, v in enumerate(VARIANTS)}
    rows.sort(key=lambda r: (order.get(r["variant"], 99), -r["capacity_gb"]))
    text = markdown(rows, same, meta) + notes
    payload = {"meta": meta, "rows": rows, "same_cut": same, "points": points}
    _write(os.path.join(out, "longest_seq_bench"), payload, text)
    if results:
        _write(os.path.join(HERE, "RESULTS-longest-seq"), payload, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small Llama (4 layers) on a scaled device: a smoke run")
    parser.add_argument("--variants", default=None,
                        help="comma-separated variant names (default: all torch and split ones)")
    parser.add_argument("--fit", default=None, help="the two fit lengths, e.g. 8192,16384 "
                        "(default: per variant, near its expected answer)")
    parser.add_argument("--same-cut", action="store_true",
                        help="check that ours@0.5/@0.0 save what torch@0.5/@0.0 save")
    parser.add_argument("--tag", default="main", help="this worker's file: out/longest_seq_w_TAG")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the models in this worker's file (same tag)")
    parser.add_argument("--resume-from", default="",
                        help="also reuse the models in these workers' files (comma-separated tags)")
    parser.add_argument("--at", default="",
                        help="only model these lengths (comma-separated), no rows: a worker "
                        "that makes models for another's --resume-from")
    parser.add_argument("--most-models", type=int, default=5,
                        help="verification models a capacity may take")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--results", action="store_true",
                        help="also write RESULTS-longest-seq.md and .json next to this file")
    parser.add_argument("--report", action="store_true",
                        help="only merge the workers' files into the report")
    args = parser.parse_args(argv)
    from aot_partition.costs import roofline

    roofline.set_device_numbers("cpu", roofline.lookup("H100"))
    from aot_partition.memory_models import simulator as memory

    # The split ops' scratch from their shapes (chunked_loss / chunked_mlp.workspace_bytes):
    # below this limit the memory model runs an op on random tensors to measure it, which for
    # an 8B MLP chunk takes minutes a run on these CPUs.
    memory._MEASURED_WORKSPACE_LIMIT = -1
    os.makedirs(args.out, exist_ok=True)
    if args.quick:
        spec, name = QUICK, "small Llama (d 256, 4 layers, vocab 8192)"
        static = static_bytes(spec)
        base = static["weights_bf16"] + static["adamw_m_v_bf16"]
        capacities = {"raw": base + 256 * 2**20, "headroom": base + 192 * 2**20}
    else:
        spec, name = LLAMA3_8B, "Llama-3-8B shapes"
        capacities = {"raw": 80 * GB, "headroom": 76 * GB}
    import transformers

    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "model": name, "spec": spec, "layers": spec["num_hidden_layers"],
            "static_bytes": static_bytes(spec), "capacities_bytes": capacities, "step": STEP,
            "chunks": "split ops: one chunk per 1024 tokens, at most 64", "simulated": True}
    if args.report:
        print(merge(args.out, args.results, meta, NOTES))
        return 0
    variants = [v for v in VARIANTS if v.who == "torch" or v.split]
    variants = [v for v in variants if "mlp" not in v.split or mlp_split_available()]
    if args.variants is not None:
        wanted = [w.strip() for w in args.variants.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in {v.name for v in VARIANTS}]
        if unknown:
            parser.error(f"unknown variants {unknown}; valid: "
                         f"{', '.join(v.name for v in VARIANTS)}")
        variants = [v for v in VARIANTS if v.name in wanted]
    started = time.perf_counter()
    rows: list[Row] = []
    same: list[dict[str, Any]] = []
    worker = os.path.join(args.out, f"longest_seq_w_{args.tag}")
    bench = Bench(spec, capacities)

    def save() -> None:
        points = [asdict(p) for ps in bench.points.values() for p in ps.values()]
        _write(worker, {"meta": {**meta, "seconds": time.perf_counter() - started},
                        "rows": [asdict(r) for r in rows], "same_cut": same, "points": points})

    tags = ([args.tag] if args.resume else []) + [t for t in args.resume_from.split(",") if t]
    for tag in tags:
        path = os.path.join(args.out, f"longest_seq_w_{tag}.json")
        if os.path.exists(path):
            with open(path) as f:
                for p in json.load(f)["points"]:
                    if p["variant"] in {v.name for v in variants}:
                        bench.points.setdefault(p["variant"], {})[p["seq"]] = Point(**p)
    if tags:
        print(f"  resumed {sum(map(len, bench.points.values()))} models", file=sys.stderr)
    bench.log = save
    if args.at:
        for variant in variants:
            for seq in (int(s) for s in args.at.split(",")):
                bench.measure(variant, seq)
        return 0
    if args.same_cut:
        by = {v.name: v for v in VARIANTS}
        same += same_cut_check(bench, 1024 if args.quick else 8192,
                               [(by["ours@0.5"], by["torch@0.5"]),
                                (by["ours@0.0"], by["torch@0.0"])])
        save()
    for variant in variants:
        print(f"{variant.name}", file=sys.stderr)
        if args.fit:
            fit = tuple(int(s) for s in args.fit.split(","))
        else:
            fit = QUICK_FIT if args.quick else FIT.get(variant.name, (8192, 16384))
        rows += bench.run(variant, fit, args.most_models)  # type: ignore[arg-type]
        save()
        merge(args.out, args.results, meta, NOTES)
    print(merge(args.out, args.results, meta, NOTES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
