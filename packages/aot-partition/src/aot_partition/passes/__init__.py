"""Graph passes run around partitioning: one function per pass, graph in, graph out."""

from __future__ import annotations

from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .recompute_tags import (
    cleanup_recompute_tags,
    has_recomputable_ops,
    must_recompute,
    must_save,
    save_readers_of_mutated_inputs,
)
from .reorder import reorder_backward
from .rng import replay_obstacle, replay_random_ops

__all__ = [
    "cleanup_recompute_tags",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "has_recomputable_ops",
    "must_recompute",
    "must_save",
    "reorder_backward",
    "replay_obstacle",
    "replay_random_ops",
    "save_readers_of_mutated_inputs",
]
