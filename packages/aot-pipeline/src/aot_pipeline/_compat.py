"""The torch internals this package builds on, imported in one place (torch 2.11 to 2.15).

Every supported release has ``torch._inductor.config.custom_partitioner_fn`` (an instance of
``CustomPartitionerFn``), ``compile_fx(model, example_inputs, inner_compile=..., config_patches=...)``
and ``torch._dynamo.backends.common.aot_autograd``; if a release moves them, adapt here only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch


def compile_fx() -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    return inductor_compile_fx


def compile_fx_inner() -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx_inner as inductor_compile_fx_inner

    return inductor_compile_fx_inner


def custom_partitioner_base() -> type:
    """Inductor's base class for a partitioner that replaces its own min-cut partitioner."""
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    return CustomPartitionerFn


def inductor_config_keys() -> frozenset[str]:
    """The names ``torch.compile(..., options=...)`` accepts for Inductor (its config keys)."""
    from torch._inductor import config

    return frozenset(config.get_config_copy())


def inductor_config_type(name: str) -> Any:
    """The declared type of ``torch._inductor.config.<name>`` (may be a subscripted generic)."""
    from torch._inductor import config

    return config.get_type(name)  # type: ignore[attr-defined]


def inductor_mode_options(mode: str | None = None) -> dict[str, Any]:
    """Inductor config for ``torch.compile``'s ``mode`` (all modes when ``mode`` is None).

    The same table ``backend="inductor"`` applies (``torch._inductor.list_mode_options``);
    an unknown mode raises RuntimeError.
    """
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def reset_cudagraph_trees() -> None:
    """What ``torch._dynamo.reset()`` does for ``backend="inductor"`` with CUDA graphs."""
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees as inductor_reset

    inductor_reset()


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """Dynamo's AOTAutograd back-end factory (it calls ``aot_module_simplified``)."""
    from torch._dynamo.backends.common import aot_autograd as dynamo_aot_autograd

    return dynamo_aot_autograd(**kwargs)


def compile_region_names_supported() -> bool:
    """Whether this torch names compiled regions (``torch.compile(name=...)``, torch 2.13 on):
    ``compile_fx`` and ``aot_module_simplified`` then take ``compile_region_name``."""
    import inspect

    from torch._functorch.aot_autograd import aot_module_simplified

    return "compile_region_name" in inspect.signature(aot_module_simplified).parameters


def cuda_available() -> bool:
    return torch.cuda.is_available()


_Copied = TypeVar("_Copied")


def deepcopy_graph(graph: _Copied) -> _Copied:
    """A deep copy of an FX graph (or a tuple of them) we make to price or record a plan,
    without the FutureWarning torch >= 2.13 gives for each pytree ``LeafSpec`` a graph's code
    holds ("isinstance(treespec, LeafSpec) is deprecated"): the copy is ours, not the user's
    code, and the warning said nothing to them (a capped train row printed it twice)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                                category=FutureWarning)
        return copy.deepcopy(graph)


# What AOTAutograd reads of a graph Dynamo captured, beyond its nodes and meta, and a deep copy
# drops: the parameters' sources (``_param_name_to_source``) and each placeholder's
# (``Node._dynamo_source``). Without them a copy counts as "not captured by Dynamo": no static
# inputs (parameters priced and, under CUDA graphs, copied as if they changed every step) and
# no argument sources for its duplicate-argument guards.
_DYNAMO_GRAPH_ATTRS = ("_param_name_to_source",)


def copy_dynamo_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A deep copy of a graph Dynamo handed a back end that AOTAutograd still reads as Dynamo's
    (``deepcopy_graph`` plus the sources it drops, shared: they are read only)."""
    copied = deepcopy_graph(gm)
    for attr in _DYNAMO_GRAPH_ATTRS:
        if hasattr(gm, attr):
            setattr(copied, attr, getattr(gm, attr))
    for old, new in zip(gm.graph.find_nodes(op="placeholder"),
                        copied.graph.find_nodes(op="placeholder"), strict=True):
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    return copied
