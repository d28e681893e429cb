"""Per-region memory budgets: the annotations that set them and the regions they make.

A forward op traced under ``torch.autograd.graph.region_activation_memory_budget(b)`` (torch
2.13+) carries ``b`` in ``node.meta["custom"][TORCH_REGION_KEY]``; one traced under ours,
``region_memory_budget(b)``, carries a fraction there too, or a byte cap (``"64KiB"``,
``65536``) in ``node.meta["custom"][BYTES_REGION_KEY]``. A region is every forward op with one
budget value: two blocks under equal budgets form one region. torch accepts one budget per
graph covering every forward op; we accept several, and ops outside every region stay under
the global budget (see region_budget.py).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

import torch.fx as fx

from .classify import NodeInfo
from .joint import BYTES_REGION_KEY, TORCH_REGION_KEY

__all__ = [
    "BYTES_REGION_KEY",
    "TORCH_REGION_KEY",
    "RegionBudget",
    "Regions",
    "find_regions",
    "parse_region_budget",
    "region_memory_budget",
]


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*", re.ASCII)


@dataclass(frozen=True)
class RegionBudget:
    """One region's budget: a fraction in [0, 1] (of the region's activations at the
    runtime-optimal cut, above the least it can save) or a cap in bytes."""

    fraction: float | None = None
    nbytes: int | None = None

    @property
    def label(self) -> str:
        return f"{self.fraction:g}" if self.fraction is not None else f"{self.nbytes} bytes"


def parse_region_budget(value: object) -> RegionBudget:
    """A region budget as written: a float (or int 0/1) in [0, 1] is a fraction; an int >= 2
    or a size string (``"64KiB"``, ``"1.5MB"``) is a cap in bytes. ValueError otherwise."""
    valid = ("a fraction in [0, 1] or a byte cap: an int >= 2 or a size with a unit "
             "such as '64KiB' (units: " + ", ".join(_UNITS) + ")")
    if isinstance(value, bool):
        raise ValueError(f"region memory budget must be {valid}; got {value!r}")
    if isinstance(value, float) or value in (0, 1):
        fraction = float(value)
        if not 0.0 <= fraction <= 1.0:  # NaN fails too
            raise ValueError(f"region memory budget must be {valid}; got {value!r}")
        return RegionBudget(fraction=fraction)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"region memory budget must be {valid}; got {value!r}")
        return RegionBudget(nbytes=value)
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match is not None and match.group(2).lower() in _UNITS:
            amount = float(match.group(1)) * _UNITS[match.group(2).lower()]
            if math.isfinite(amount) and amount < 2**63:
                return RegionBudget(nbytes=int(amount))
    shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
    raise ValueError(f"region memory budget must be {valid}; got {shown!r}")


def region_memory_budget(budget: float | int | str) -> contextlib.AbstractContextManager[None]:
    """The region budget for the forward ops traced under it (``torch.compile`` or any tracer
    that keeps ``node.meta["custom"]``): a fraction (as torch's
    ``region_activation_memory_budget``) or a byte cap (``"64KiB"``). Several regions with
    different budgets may share a graph under aot_partition's partitioner."""
    parsed = parse_region_budget(budget)
    annotate = _annotate()
    if not _tracing():
        raise RuntimeError("region_memory_budget only takes effect while a graph is traced "
                           "(torch.compile, aot_function / aot_module, make_fx); in eager "
                           "mode it would be ignored, so it is refused there")
    if parsed.fraction is not None:
        return annotate({TORCH_REGION_KEY: parsed.fraction})
    return annotate({BYTES_REGION_KEY: parsed.nbytes})


def _tracing() -> bool:
    """Whether ops run now are being traced into a graph that keeps node annotations:
    Dynamo, or AOTAutograd / make_fx (their fake-tensor passes, the node-meta-preserving one)."""
    import torch
    import torch.fx.traceback as fx_traceback
    from torch._guards import detect_fake_mode

    return (torch.compiler.is_compiling() or fx_traceback.has_preserved_node_meta()
            or detect_fake_mode() is not None)


def _annotate():
    import torch.fx.traceback as fx_traceback

    annotate = getattr(fx_traceback, "annotate", None)
    if annotate is None:
        raise RuntimeError("region_memory_budget needs torch.fx.traceback.annotate, which this "
                           "torch lacks (torch 2.13+ has it)")
    return annotate


def region_of(node: fx.Node) -> RegionBudget | None:
    """The budget annotated on ``node`` (None when it has none); ValueError on a bad value or
    on both a fraction and a byte cap (nested regions of both kinds: say which one wins by
    nesting only one kind)."""
    custom = node.meta.get("custom")
    if not isinstance(custom, dict):
        return None
    fraction = custom.get(TORCH_REGION_KEY)
    nbytes = custom.get(BYTES_REGION_KEY)
    if fraction is not None and nbytes is not None:
        raise ValueError(f"node '{node.name}' is in a region with fraction budget {fraction!r} "
                         f"and one with byte budget {nbytes!r}; nest regions of one kind only")
    if fraction is None and nbytes is None:
        return None
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"node '{node.name}': {BYTES_REGION_KEY} must be an int >= 0 "
                             f"(bytes); got {nbytes!r}")
        return RegionBudget(nbytes=nbytes)
    try:
        parsed = parse_region_budget(fraction)
    except ValueError as exc:
        raise ValueError(f"node '{node.name}': {exc}") from None
    if parsed.fraction is None:
        raise ValueError(f"node '{node.name}': {TORCH_REGION_KEY} must be a fraction in "
                         f"[0, 1]; got {fraction!r}")
    return parsed


@dataclass
class Regions:
    """The regions of a joint graph: forward nodes by budget, and the forward ops in none."""

    nodes: dict[RegionBudget, set[fx.Node]]
    unannotated_forward_ops: list[fx.Node]

    def whole_forward_fraction(self) -> float | None:
        """torch's case: one fractional region over every forward op; its fraction."""
        if len(self.nodes) == 1 and not self.unannotated_forward_ops:
            (budget,) = self.nodes
            return budget.fraction
        return None

    def of(self, node: fx.Node) -> RegionBudget | None:
        for budget, members in self.nodes.items():
            if node in members:
                return budget
        return None


def find_regions(joint_graph: fx.Graph, node_info: NodeInfo) -> Regions:
    """The region of every forward node of ``joint_graph`` (backward nodes carry their forward
    op's annotation too; only the forward's count)."""
    nodes: dict[RegionBudget, set[fx.Node]] = {}
    unannotated: list[fx.Node] = []
    for node in joint_graph.nodes:
        if not node_info.is_required_fw(node) and node not in node_info.unclaimed:
            continue
        budget = region_of(node)
        if budget is not None:
            nodes.setdefault(budget, set()).add(node)
        elif node.op == "call_function" and node_info.is_required_fw(node):
            unannotated.append(node)
    return Regions(nodes, unannotated)
