"""What a node costs to run: runtime estimates (``estimators``: FLOPs, profiles, roofline),
the device roofline (``roofline``), the runtime of a cut's graphs (``cut_runtime``), and the
agreement of measured costs across ranks (``spmd``: every rank decides on the same numbers).

Below the joint's front end's passes and cut (``fx.classify``, ``fx.policy`` read no costs;
``fx.offload``, the memory models and the budget search do)."""

from .. import _fx_extra  # noqa: F401 - first: without torch, an error naming the extra
