"""Built-in tiny models: the CLI trains them, the tests and benchmarks partition them.

Every model is plain eager PyTorch with fixed shapes chosen by its constructor, so a joint graph of
it is small and deterministic. ``build_model(name, **sizes)`` returns the module and a function
that makes a batch of synthetic inputs for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .model_names import MODEL_NAMES

__all__ = [
    "MODEL_NAMES",
    "MLP",
    "GPT",
    "Llama",
    "ConvNet",
    "BuiltModel",
    "TrainingStep",
    "build_model",
    "next_token_loss",
    "squared_mean_loss",
]


class MLP(nn.Module):
    """A deep MLP with GELU activations."""

    def __init__(self, dim: int = 32, layers: int = 4, out: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention, written out (matmul + softmax) or with SDPA."""

    def __init__(self, dim: int, heads: int, sdpa: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.sdpa = sdpa
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
            mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, sdpa: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, sdpa)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-style decoder stack over token embeddings; returns logits."""

    def __init__(
        self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, seq: int = 16,
        sdpa: bool = False,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, sdpa) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class RMSNorm(nn.Module):
    """RMSNorm written by hand, as llama-style code does."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, sdpa=False)
        self.norm2 = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))  # SwiGLU


class Llama(nn.Module):
    """A llama-style stack: RMSNorm, attention and SwiGLU feed-forward."""

    def __init__(
        self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, seq: int = 16,
        hidden: int = 64,
    ) -> None:
        super().__init__()
        del seq  # no learned positions; kept for a uniform constructor signature
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class ConvNet(nn.Module):
    """Conv, batch norm (training mode), ReLU and max-pool, then a linear head."""

    def __init__(self, channels: int = 8, layers: int = 2, classes: int = 10, image: int = 16) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        in_ch = 3
        for i in range(layers):
            out_ch = channels * (2**i)
            blocks += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch), nn.ReLU(),
                       nn.MaxPool2d(2)]
            in_ch = out_ch
        self.features = nn.Sequential(*blocks)
        side = image // (2**layers)
        if side < 1:
            raise ValueError(f"image={image} is too small for layers={layers} max-pools")
        self.head = nn.Linear(in_ch * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))



def squared_mean_loss(output: torch.Tensor, inputs: tuple[torch.Tensor, ...] = ()
                      ) -> torch.Tensor:
    """The mean square of the output, in fp32: a loss for a model without labels."""
    del inputs
    return output.float().pow(2).mean()


def next_token_loss(logits: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A language model's training loss: fp32 cross-entropy of each position's logits against
    the next token of the batch (the last position ignored), as transformers' causal-LM loss
    shifts its labels."""
    ids = inputs[0]
    targets = F.pad(ids[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


class TrainingStep(nn.Module):
    """A model and its loss as one module: ``step(*inputs)`` returns the loss, so a compiler
    given the step compiles the loss with the model, as a training step does (the LM head's
    split and the step's peak cap need the loss inside)."""

    def __init__(self, model: nn.Module,
                 loss_fn: Callable[[Any, tuple[torch.Tensor, ...]], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(*inputs), inputs)


@dataclass
class BuiltModel:
    """A model with a batch maker and its training loss: ``loss(output, inputs)`` reduces the
    output for those inputs to a scalar (next-token cross-entropy for the language models,
    the output's mean square for the rest); ``training_step()`` is both as one module."""

    name: str
    module: nn.Module
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    loss_fn: Callable[[Any, tuple[torch.Tensor, ...]], torch.Tensor] = squared_mean_loss

    def loss(self, output: Any, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.loss_fn(output, inputs)

    def training_step(self) -> TrainingStep:
        return TrainingStep(self.module, self.loss_fn)


def build_model(
    name: str, *, layers: int | None = None, batch: int = 2, seed: int = 0,
    device: str | torch.device = "cpu", **sizes: int,
) -> BuiltModel:
    """Build a built-in model by name with fixed seeds; ``sizes`` go to its constructor."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    torch.manual_seed(seed)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        sizes["layers"] = layers
    generator = torch.Generator().manual_seed(seed + 1)
    # Constructor arguments: the sizes, and flags such as GPT's sdpa (a bool is an int here).
    arguments: dict[str, Any] = sizes
    module: nn.Module
    if name == "mlp":
        mlp = MLP(**arguments)
        module = mlp
        dim = mlp.head.in_features  # the width of every layer

        def make_inputs() -> tuple[torch.Tensor, ...]:
            return (torch.randn(batch, dim, generator=generator).to(device),)
    elif name in ("gpt", "llama"):
        language_model = GPT(**arguments) if name == "gpt" else Llama(**arguments)
        module = language_model
        vocab = language_model.tok.num_embeddings
        seq = sizes.get("seq", 16)

        def make_inputs() -> tuple[torch.Tensor, ...]:
            return (torch.randint(0, vocab, (batch, seq), generator=generator).to(device),)
    else:
        module = ConvNet(**arguments)
        image = sizes.get("image", 16)

        def make_inputs() -> tuple[torch.Tensor, ...]:
            return (torch.randn(batch, 3, image, image, generator=generator).to(device),)
    loss_fn = next_token_loss if name in ("gpt", "llama") else squared_mean_loss
    return BuiltModel(name, module.to(device), make_inputs, loss_fn)
