"""Rank-side functions of tests/aot_pipeline/test_token_split.py's FSDP2 case (issue 39): a small
language model under FSDP2 on gloo ranks, compiled whole (the loss inside) with the LM head and
its loss split in chunks; the gradients against one process's eager model over every rank's
batch."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, DIM = 64, 16


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.GELU(),
                          nn.Linear(4 * DIM, DIM)) for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Unrolled: each FSDP2 block call is a graph break (its hooks are not traced), which
        # Dynamo cannot resume inside a loop; the head and the loss end the last graph.
        x = self.embed(ids)
        x = x + self.blocks[0](x)
        x = x + self.blocks[1](x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(world):
        ids = torch.randint(0, VOCAB, (2, 32), generator=g)
        labels = ids.clone()
        labels[:, :5] = -100
        out.append((ids, labels))
    return out


def fsdp2_split(variants: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Each (compiler, chunks) in one start of the ranks (see ``_fsdp2_split``)."""
    return [_fsdp2_split(compiler, chunks) for compiler, chunks in variants]


def _fsdp2_split(compiler: str, chunks: int) -> dict[str, Any]:
    """FSDP2 (each block, then the root) and the root compiled by aot_pipeline with
    ``split=chunks``: the largest gradient error against eager, what was split."""
    import aot_pipeline.backend as backend
    from aot_pipeline.recording import PartitionRecorder
    from torch.distributed.fsdp import fully_shard

    batches = _batches(dist.get_world_size())
    torch.manual_seed(0)
    eager = LanguageModel()
    (sum(eager(*b) for b in batches) / len(batches)).backward()
    want = {n: p.grad for n, p in eager.named_parameters()}

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = LanguageModel()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    recorder = PartitionRecorder()
    compiled = torch.compile(lambda ids, labels: model(ids, labels), backend=backend.make_backend(
        {"split": chunks, "compiler": compiler}, recorder))
    loss = compiled(*batches[dist.get_rank()])
    loss.backward()
    worst = 0.0
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        worst = max(worst, float((grad - want[name.replace("_orig_mod.", "")]).abs().max()))
    return {"max_grad_error": worst, "splits": [d.describe() for d in recorder.splits],
            "graphs": counters["stats"]["unique_graphs"], "partitions": len(recorder.partitions),
            "left_alone": [a.reason for a in recorder.split_left_alone]}
