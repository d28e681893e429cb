"""Fixtures and compile helpers for the aot_compilers tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from aot_partition import default_partition, min_cut_rematerialization_partition
from torch import nn
from torch._functorch.aot_autograd import aot_function, aot_module

PARTITIONS = {"default": default_partition, "min_cut": min_cut_rematerialization_partition}


@pytest.fixture
def fresh_dynamo():
    """Reset torch.compile caches before and after a test that compiles."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def with_aot_module(compiler: Callable[..., Any], partition: str = "min_cut"
                    ) -> Callable[[nn.Module], Callable[..., Any]]:
    def compile_fn(module: nn.Module) -> Callable[..., Any]:
        return aot_module(module, fw_compiler=compiler, bw_compiler=compiler,
                          partition_fn=PARTITIONS[partition])
    return compile_fn


def with_aot_function(compiler: Callable[..., Any], partition: str = "min_cut"
                      ) -> Callable[[nn.Module], Callable[..., Any]]:
    """Compile ``module`` as a pure function of (parameters, *inputs) with ``aot_function``."""
    def compile_fn(module: nn.Module) -> Callable[..., Any]:
        def pure(params: dict[str, torch.Tensor], *inputs: torch.Tensor) -> Any:
            return torch.func.functional_call(module, params, inputs)

        compiled = aot_function(pure, fw_compiler=compiler, bw_compiler=compiler,
                                partition_fn=PARTITIONS[partition])
        return lambda *inputs: compiled(dict(module.named_parameters()), *inputs)
    return compile_fn


def with_torch_compile(backend: Any) -> Callable[[nn.Module], Callable[..., Any]]:
    # A plain function around the OptimizedModule: zoo.run_with_grads does `call or module`,
    # and bool(OptimizedModule) raises "does not support len()".
    def compile_fn(module: nn.Module) -> Callable[..., Any]:
        compiled = torch.compile(module, backend=backend)
        return lambda *inputs: compiled(*inputs)
    return compile_fn


@pytest.fixture(scope="session")
def compile_with():
    """The compile helpers above (conftest modules are not importable by name under importlib
    mode): ``compile_with.aot_module(nop)`` etc."""
    from types import SimpleNamespace

    return SimpleNamespace(aot_module=with_aot_module, aot_function=with_aot_function,
                           torch_compile=with_torch_compile)
