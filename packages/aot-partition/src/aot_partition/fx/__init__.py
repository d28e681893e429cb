"""The torch.fx front end: AOTAutograd's joint-graph conventions (``joint``), node
classification (``classify``), graph passes (``passes``), torch's ban rules (``policy``),
runtime estimators (``estimators``, ``roofline``), sizes, the translation into the core's plain
graph (``network``, ``solve``), the memory simulator (``memory``) and the extraction of the
forward and backward GraphModules (``extract``)."""
