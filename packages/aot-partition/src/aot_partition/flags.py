"""Read partitioner flags from ``aot_config.functorch`` (never from torch's own config).

torch sets ``torch._functorch.config`` internally; the partitioner honours only our flags. Every
flag read here is declared in ``aot_config.functorch``; one place to read them keeps that true.
Only ``config.py`` calls ``read_flag``: a partition reads the flags once, into a
``PartitionConfig``, and every decision after that reads the config.
"""

from __future__ import annotations

from typing import Any

from aot_config import functorch as functorch_config


def read_flag(name: str) -> Any:
    """The current value of functorch flag ``name`` (AttributeError names the closest flag)."""
    return getattr(functorch_config, name)
