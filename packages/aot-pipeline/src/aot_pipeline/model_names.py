"""The built-in models' and training variants' names, importable without torch (the CLI
checks its arguments before it imports torch)."""

from __future__ import annotations

MODEL_NAMES = ("mlp", "gpt", "llama", "convnet")
# What `aot-pipeline train` can run side by side (train.py runs them).
VARIANTS: tuple[str, ...] = ("eager", "inductor", "aot_pipeline")
