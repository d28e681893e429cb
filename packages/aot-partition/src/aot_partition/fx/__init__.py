"""The torch.fx front end: AOTAutograd's joint-graph conventions (``joint``), node
classification (``classify``), graph passes (``passes``), torch's ban rules (``policy``),
runtime estimators (``estimators``, ``roofline``), sizes, the translation into the core's plain
graph (``network``, ``solve``), the memory simulator (``memory``) and the extraction of the
forward and backward GraphModules (``extract``)."""

try:  # the front end needs torch, an extra of this package (the core does not)
    import torch  # noqa: F401
except ImportError as error:
    raise ImportError("aot_partition.fx (the torch.fx front end) needs torch: pip install "
                      "'aot-partition[fx]'. The core, aot_partition.core, needs no torch.") from error
