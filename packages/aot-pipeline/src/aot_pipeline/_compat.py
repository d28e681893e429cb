"""The torch internals this package builds on, imported in one place (torch 2.11 to 2.15).

Every supported release has ``torch._inductor.config.custom_partitioner_fn`` (an instance of
``CustomPartitionerFn``), ``compile_fx(model, example_inputs, inner_compile=..., config_patches=...)``
and ``torch._dynamo.backends.common.aot_autograd``; if a release moves them, adapt here only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """Dynamo's AOTAutograd back-end factory (it calls ``aot_module_simplified``)."""
    from torch._dynamo.backends.common import aot_autograd as dynamo_aot_autograd

    return dynamo_aot_autograd(**kwargs)


def cuda_available() -> bool:
    return torch.cuda.is_available()
