"""Graph passes run around partitioning. Every pass has one shape: it takes an ``fx.Graph``,
edits it in place and returns whether it changed anything (True/False; the RNG replay returns
the names of the ops it rewrote). A caller holding a GraphModule recompiles it once after its
passes: ``if eliminate_dead_code(gm.graph): gm.recompile()``.

- ``dce``: drop dead code (``eliminate_dead_code``).
- ``cse``: merge common subexpressions (``eliminate_common_subexpressions``; the undoable
  ``merge_common_subexpressions`` that the partitioner uses on the caller's joint).
- ``recompute_tags``: checkpoint annotations (``must_save``, ``must_recompute``), the tag
  clean-up between regions, and MUST_SAVE for readers of inputs mutated in place.
- ``rng``: replay a recomputed random op's RNG state (``replay_random_ops``) through the
  operators of ``rng_ops``, which run under any dispatch mode.
- ``reorder``: order the backward like the autograd engine runs it (``reorder_backward``).

Passes sit at the bottom of the package: they use only ``joint`` and ``_compat``.
"""

from __future__ import annotations

from .cse import eliminate_common_subexpressions, merge_common_subexpressions
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
    "merge_common_subexpressions",
    "must_recompute",
    "must_save",
    "reorder_backward",
    "replay_obstacle",
    "replay_random_ops",
    "save_readers_of_mutated_inputs",
]
