"""The built-in models' names, importable without torch (the CLI parses arguments first)."""

from __future__ import annotations

MODEL_NAMES = ("mlp", "gpt", "llama", "convnet")
