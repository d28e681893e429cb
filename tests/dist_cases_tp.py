"""Rank-side functions for tests/aot_partition/test_distributed_tp.py (run by ranks.run_ranks).

Tensor parallel (DTensor, ``parallelize_module``) and FSDP2 + TP on a 2-D mesh, compiled with
``torch.compile(backend="aot_pipeline")``, each variant compared with an eager replica that is
not sharded: same initial weights, same global batch, three SGD steps, gradients compared at
every step (a sharded gradient through ``full_tensor()``). Every function returns, per variant,
the largest gradient difference seen, or the error it raised (as text), so one run covers many
variants and a test names the ones that failed.
"""

from __future__ import annotations

import copy
import functools
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS = 3
LEARNING_RATE = 0.1


def _pipeline(budget: float, compiler: str) -> dict[str, Any]:
    """torch.compile's arguments: our back end with ``compiler``, or with "torch_inductor"
    torch's own ``backend="inductor"`` (its partitioner; ``budget`` ignored)."""
    import aot_pipeline  # noqa: F401  (registers the back end)

    if compiler == "torch_inductor":
        return {"backend": "inductor"}
    return {"backend": "aot_pipeline", "options": {"compiler": compiler, "memory_budget": budget}}


def _full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _max_grad_difference(model: nn.Module, reference: nn.Module) -> float:
    worst = 0.0
    ours = dict(model.named_parameters())
    for name, param in reference.named_parameters():
        mine = ours[_strip(name, ours)]
        if mine.grad is None or param.grad is None:
            raise AssertionError(f"no gradient for {name}")
        worst = max(worst, float((_full(mine.grad) - param.grad).abs().max()))
    return worst


def _strip(name: str, names: Iterable[str]) -> str:
    """The parameter ``name`` of the eager replica as the compiled (wrapped) model names it:
    ``torch.compile`` and checkpoint wrappers add ``_orig_mod.`` and
    ``_checkpoint_wrapped_module.`` to the path."""
    for candidate in names:
        plain = (candidate.replace("_orig_mod.", "")
                 .replace("_checkpoint_wrapped_module.", ""))
        if plain == name:
            return candidate
    raise KeyError(f"no parameter of the compiled model matches {name}")


def _sgd_step(model: nn.Module) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param -= LEARNING_RATE * param.grad
            param.grad = None


def _train_and_compare(model: nn.Module, reference: nn.Module,
                       batches: list[tuple[Callable[[nn.Module], torch.Tensor],
                                           Callable[[nn.Module], torch.Tensor]]]) -> float:
    """STEPS steps of (compiled loss, eager loss) on both models; the worst gradient gap."""
    worst = 0.0
    for ours, theirs in batches:
        ours(model).backward()
        theirs(reference).backward()
        worst = max(worst, _max_grad_difference(model, reference))
        _sgd_step(model)
        _sgd_step(reference)
    return worst


def _variants(run: Callable[..., float], variants: list[dict[str, Any]]) -> dict[str, Any]:
    """``run(**variant)`` for each variant, after a Dynamo reset, keyed by the variant's
    description: ``{"grad": worst gradient gap, "saved": [saved activation bytes of each
    forward our partitioner made]}``, or the error's traceback text."""
    import aot_partition

    partition = aot_partition.min_cut_rematerialization_partition
    saved: list[int] = []

    @functools.wraps(partition)
    def recording(*args: Any, **kwargs: Any) -> Any:
        forward, backward = partition(*args, **kwargs)
        saved.append(aot_partition.saved_activation_bytes(forward))
        return forward, backward

    results: dict[str, Any] = {}
    aot_partition.min_cut_rematerialization_partition = recording  # read at each partition
    try:
        for variant in variants:
            torch._dynamo.reset()
            saved.clear()
            key = ", ".join(f"{k}={v}" for k, v in variant.items())
            try:
                results[key] = {"grad": run(**variant), "saved": list(saved)}
            except Exception:
                results[key] = traceback.format_exc()[-3000:]
    finally:
        aot_partition.min_cut_rematerialization_partition = partition
    return results


# ---- tensor parallel: two MLPs, 1-D mesh ---------------------------------------------------

class MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class TwoMLPs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = MLP()
        self.second = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)).sin()


def tensor_parallel_mlps(variants: list[dict[str, Any]]) -> dict[str, Any]:
    """Two MLPs, ``ColwiseParallel`` up and ``RowwiseParallel`` down on a 1-D mesh of every
    rank, the whole model compiled; variants: ``budget``, ``compiler``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {f"{mlp}.{layer}": style for mlp in ("first", "second")
            for layer, style in (("up", ColwiseParallel()), ("down", RowwiseParallel()))}

    def run(budget: float, compiler: str) -> float:
        torch.manual_seed(0)
        reference = TwoMLPs()
        model = parallelize_module(copy.deepcopy(reference), mesh, plan)
        compiled = torch.compile(model, **_pipeline(budget, compiler))
        inputs = [torch.randn(4, 8) for _ in range(STEPS)]  # the same on every rank (seeded)
        batches = [(functools.partial(lambda m, x: m(x).sum(), x=x),
                    functools.partial(lambda m, x: m(x).sum(), x=x)) for x in inputs]
        return _train_and_compare(compiled, reference, batches)

    return _variants(run, variants)


# ---- FSDP2 + TP: a tiny llama-style model on a 2-D mesh ------------------------------------

DIM, HEADS, VOCAB, SEQ = 32, 4, 64, 8

# torch 2.13 and 2.15 (not 2.11), CPU/gloo, any AOTAutograd back end (aot_eager too): when a
# compiled block's input is the view that DTensor's to_local() returns (the embeddings of a
# RowwiseParallel tok_embeddings), the gradient reaching the embeddings is wrong (FSDP2 + TP)
# or the backward raises "'Tensor' object has no attribute '_local_tensor'" (TP alone).
TO_LOCAL_VIEW_BUG = ("torch >= 2.12: a compiled block whose input is DTensor.to_local()'s view "
                     "gets a wrong input gradient, with torch's own aot_eager too")


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallel each rank holds only its share of them
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, hidden, bias=False)
        self.w2 = nn.Linear(hidden, DIM, bias=False)
        self.w3 = nn.Linear(DIM, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    """``copy_embeddings``: the first block reads a copy of the embeddings, not the view
    ``to_local()`` returns: a compiled block whose input is that view gets a wrong input
    gradient from torch 2.12 on (``TO_LOCAL_VIEW_BUG``)."""

    def __init__(self, num_blocks: int = 2, copy_embeddings: bool = True) -> None:
        super().__init__()
        self.copy_embeddings = copy_embeddings
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(num_blocks))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.copy_embeddings:
            h = h.clone()
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def _tp_plans(sequence_parallel: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the model's plan, each block's plan), torchtitan's llama recipe."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
               "output": ColwiseParallel(output_layouts=Replicate())}
        block = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                 "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                 "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                 "feed_forward.w2": RowwiseParallel()}
        return top, block
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
           "norm": SequenceParallel(),
           "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    block = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                        desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    return top, block


def _selective_checkpoint(block: nn.Module) -> nn.Module:
    """torchtitan's op-level selective activation checkpointing: matmuls and attention are
    saved, everything else is recomputed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return (CheckpointPolicy.MUST_SAVE if op in save
                else CheckpointPolicy.PREFER_RECOMPUTE)

    return checkpoint_wrapper(block, context_fn=functools.partial(
        create_selective_checkpoint_contexts, policy), preserve_rng_state=False)


def fsdp_tp_llama(variants: list[dict[str, Any]], data_parallel: int = 2,
                  backend: str = "aot_pipeline", copy_embeddings: bool = True) -> dict[str, Any]:
    """FSDP2 over the ``dp`` dimension, TP over ``tp`` (torchtitan's order: TP, activation
    checkpointing, per-block compile, ``fully_shard`` per block then the root). Variants:
    ``budget``, ``compiler``, ``sequence_parallel``, ``checkpoint``; ``backend`` "aot_eager"
    runs torch's own stack instead, "none" no compile at all (budget and compiler ignored)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (data_parallel, world // data_parallel),
                             mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()

    def run(budget: float, compiler: str, sequence_parallel: bool, checkpoint: bool) -> float:
        torch.manual_seed(0)
        reference = TinyLlama(copy_embeddings=copy_embeddings)
        model = copy.deepcopy(reference)
        top_plan, block_plan = _tp_plans(sequence_parallel)
        parallelize_module(model, mesh["tp"], top_plan)
        options = (_pipeline(budget, compiler) if backend == "aot_pipeline"
                   else {"backend": backend})
        for index, block in enumerate(model.layers):
            parallelize_module(block, mesh["tp"], block_plan)
            if checkpoint:
                block = _selective_checkpoint(block)
            if backend != "none":
                block = torch.compile(block, **options)
            fully_shard(block, mesh=mesh["dp"])
            model.layers[index] = block
        fully_shard(model, mesh=mesh["dp"])
        # The global batch: every dp rank takes its rows; the eager replica takes all of them
        # and averages the dp shards' losses, as FSDP averages their gradients.
        tokens = [torch.randint(0, VOCAB, (2 * data_parallel, SEQ)) for _ in range(STEPS)]
        targets = [torch.randint(0, VOCAB, (2 * data_parallel, SEQ)) for _ in range(STEPS)]

        def ours(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            rows = slice(2 * dp_rank, 2 * dp_rank + 2)
            return F.cross_entropy(m(x[rows]).flatten(0, 1), y[rows].flatten())

        def theirs(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            losses = [F.cross_entropy(m(x[2 * r:2 * r + 2]).flatten(0, 1),
                                      y[2 * r:2 * r + 2].flatten()) for r in range(data_parallel)]
            return sum(losses) / data_parallel

        batches = [(functools.partial(ours, x=x, y=y), functools.partial(theirs, x=x, y=y))
                   for x, y in zip(tokens, targets)]
        return _train_and_compare(model, reference, batches)

    return _variants(run, variants)


# ---- one process, a fake 2-rank group: the joint of a DTensor model, split by both ---------

def dtensor_saved_groups(budgets: list[float]) -> dict[str, Any]:
    """The saved values of the TP MLPs' joint as each partitioner lays them out, by kind
    ("tensor", "opaque", "symbolic"), with the opaque ones' names: ours at each budget, torch's
    at 1.0 and 0.0 (it fails at 0.5). Replaces the default group by a fake 2-rank one (the
    joint is all that is used: no collective runs)."""
    from aot_partition import min_cut_rematerialization_partition as ours
    from aot_partition.fx.sizes import is_opaque
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as torch_functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition as theirs
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    joints: list[Any] = []

    def record(joint: Any, inputs: Any, **kwargs: Any) -> Any:
        joints.append((copy.deepcopy(joint), inputs, kwargs))
        return theirs(joint, inputs, **kwargs)

    model = parallelize_module(TwoMLPs(), mesh, {"first.up": ColwiseParallel(),
                                                 "first.down": RowwiseParallel()})
    backend = aot_autograd(fw_compiler=lambda gm, _: gm, partition_fn=record)
    torch.compile(model, backend=backend)(torch.randn(4, 8)).sum().backward()
    joint, inputs, kwargs = joints[0]

    def layout(forward: Any) -> dict[str, Any]:
        outputs = list(next(iter(forward.graph.find_nodes(op="output"))).args[0])
        saved = outputs[kwargs["num_fwd_outputs"]:]
        kinds = ["opaque" if is_opaque(n) else "symbolic"
                 if not isinstance(n.meta.get("val"), torch.Tensor) else "tensor" for n in saved]
        return {"kinds": kinds, "opaque": [n.name for n in saved if is_opaque(n)],
                "opaque_inputs": [n.name for n in joint.graph.find_nodes(op="placeholder")
                                  if is_opaque(n)]}

    from aot_config import functorch as our_flags

    found: dict[str, Any] = {}
    for budget in budgets:
        with our_flags.patch(activation_memory_budget=budget):
            found[f"ours {budget}"] = layout(ours(copy.deepcopy(joint), inputs, **kwargs)[0])
    for budget in (1.0, 0.0):
        with torch_functorch_config.patch(activation_memory_budget=budget):
            found[f"torch {budget}"] = layout(theirs(copy.deepcopy(joint), inputs, **kwargs)[0])
    return found
