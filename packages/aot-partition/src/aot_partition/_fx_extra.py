"""Imported first by the modules outside ``fx/`` that need torch (``memory_models/``,
``split/``, ``costs/``, ``budget/``, ``report/``, ``partitioners``): without torch they fail with an ImportError naming the ``[fx]`` extra, as
``aot_partition.fx`` does, instead of a bare "No module named 'torch'"."""

from __future__ import annotations

try:  # these modules import torch right after: importing it here costs nothing more
    import torch  # noqa: F401
except ImportError as error:
    raise ImportError("this part of aot_partition (the torch.fx front end, memory_models/, "
                      "split/, costs/, budget/, report/, partitioners) needs torch: pip install "
                      "'aot-partition[fx]'. The core, aot_partition.core, needs no torch.") from error
