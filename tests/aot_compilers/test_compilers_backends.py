"""The torch.compile back ends, found by NAME through the torch_dynamo_backends entry points."""

from __future__ import annotations

from importlib.metadata import entry_points

import aot_partition
import pytest
import torch
from aot_compilers import backends
from torch._dynamo.backends.registry import lookup_backend
from zoo import assert_matches_eager, make_case

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.usefixtures("fresh_dynamo")]

DECLARED = {"aot_nop", "aot_debug", "aot_print", "aot_torchscript"}


def test_entry_points_are_installed_for_every_backend():
    ours = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")
            if ep.value.startswith("aot_compilers.")}
    assert set(ours) == DECLARED, "run `uv sync` to install the package metadata"
    for name, value in ours.items():
        assert value == f"aot_compilers.backends:{name}"
        assert getattr(backends, name) is backends.BACKENDS[name]


@pytest.mark.parametrize("name", ["aot_nop", "aot_debug", "aot_print"])
def test_names_resolve_to_our_backends(name):
    assert lookup_backend(name) is getattr(backends, name)


def test_aot_torchscript_name_resolves_to_ours():
    # Not "aot_ts": torch registers a built-in of that name, and built-ins win over entry points.
    assert lookup_backend("aot_torchscript") is backends.aot_torchscript
    assert lookup_backend("aot_ts") is not backends.aot_torchscript


def test_backends_use_our_partitioners():
    for name in ("aot_nop", "aot_debug", "aot_print"):
        assert getattr(backends, name).kwargs["partition_fn"] is \
            aot_partition.min_cut_rematerialization_partition
    assert backends.aot_torchscript.kwargs["partition_fn"] is aot_partition.default_partition


@pytest.mark.parametrize("name,case", [("aot_nop", "gpt"), ("aot_nop", "dropout"),
                                       ("aot_debug", "llama"), ("aot_debug", "views")])
def test_torch_compile_by_name_matches_eager(name, case, compile_with):
    assert_matches_eager(make_case(case), compile_with.torch_compile(name))


def test_aot_print_by_name_prints_graphs(capsys, compile_with):
    assert_matches_eager(make_case("mlp"), compile_with.torch_compile("aot_print"))
    assert capsys.readouterr().out.count("def forward(") == 2


@pytest.mark.parametrize("case", ["convnet", "gpt_sdpa"])
def test_aot_torchscript_by_name_matches_eager(case, compile_with):
    assert_matches_eager(make_case(case), compile_with.torch_compile("aot_torchscript"))


def test_debug_backend_checks_dynamic_shapes():
    def f(x, w):
        return torch.tanh(x @ w).sum(0)

    w = torch.randn(8, 3, requires_grad=True)
    compiled = torch.compile(f, backend="aot_debug", dynamic=True)
    for rows in (4, 6):
        x = torch.randn(rows, 8, requires_grad=True)
        out = compiled(x, w)
        torch.testing.assert_close(out, f(x, w))
        out.sum().backward()
        torch.testing.assert_close(x.grad, torch.autograd.grad(f(x, w).sum(), x)[0])
