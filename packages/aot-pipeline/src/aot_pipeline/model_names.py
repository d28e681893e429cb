"""The built-in models' and training variants' names, importable without torch (the CLI
checks its arguments before it imports torch)."""

from __future__ import annotations

MODEL_NAMES = ("mlp", "gpt", "llama", "convnet")
# What `aot-pipeline train` can run side by side (train.py runs them): "aot_pipeline_capped" is
# ours under a peak cap (TrainSettings.capped_budget, default "0.8 peak").
VARIANTS: tuple[str, ...] = ("eager", "inductor", "aot_pipeline", "aot_pipeline_capped")
DEFAULT_CAP = "0.8 peak"
