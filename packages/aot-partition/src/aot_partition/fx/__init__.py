"""The torch.fx front end of the joint: AOTAutograd's joint-graph conventions (``joint``), sizes
(the one byte measure), node classification (``classify``), graph passes (``passes``), torch's
ban rules (``policy``), the translation into the core's plain graph (``network``, ``solve``),
the extraction of the forward and backward GraphModules (``extract``, ``cut``), regions and
offloading. The memory models, the split and the cost estimators have rooms of their own
(``memory_models``, ``split``, ``costs``)."""

try:  # the front end needs torch, an extra of this package (the core does not)
    import torch  # noqa: F401
except ImportError as error:
    raise ImportError("aot_partition.fx (the torch.fx front end) needs torch: pip install "
                      "'aot-partition[fx]'. The core, aot_partition.core, needs no torch.") from error
