"""What the program that runs allocates: the memory models a peak is priced by.

- ``simulator``: the unfused model: every FX value materialized, freed after its last use, in
  the order the graphs run (the eager step; also the measured CPU peak, ``measure_partition``).
- ``inductor``: the compiled-program model: a cut's graphs lowered by Inductor and the buffers
  its generated code allocates replayed.
- ``lowering_memo``: each distinct graph lowered once per process (the inductor model's cost).
- ``caching_allocator``: CUDA's caching allocator's blocks, as ``max_memory_allocated`` counts.
- ``pricing``: which model prices a cut (``price_partition``, ``resolve_memory_model``).
- ``symbolic_peak``, ``shape_guards``: a peak under dynamic shapes, as an expression of the
  shape symbols and guarded at every shape.

Above the joint's front end (``fx``), below the budget search (``budget``), which asks them.
"""

from .. import _fx_extra  # noqa: F401 - first: without torch, an error naming the extra
