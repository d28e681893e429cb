"""Factories for the CLI's --model package.module:factory tests (imported by path or module)."""

import torch
from torch import nn


def mlp(width: int = 16):
    """A module and its example inputs."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.GELU(), nn.Linear(width, 4)), (torch.randn(2, 8),)


def module_only():
    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 8), nn.ReLU())


def not_a_model():
    return 42


def wrong_inputs():
    return nn.Linear(2, 2), ["not", "tensors"]


def raises():
    raise RuntimeError("no weights here")


NOT_CALLABLE = 3


def dropout_mlp():
    """An mlp with dropout: its RNG state or mask is saved whatever the cut, so a byte cap of
    1 is out of reach (inputs cost nothing in the one measure of saved bytes)."""
    torch.manual_seed(0)
    return (nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4)),
            (torch.randn(2, 8),))
