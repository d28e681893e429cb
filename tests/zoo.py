"""The shared model zoo and eager-comparison helpers for every package's tests.

Each entry builds a tiny model with fixed seeds and one batch of inputs. Tests compare what a
compiled or partitioned model computes against eager PyTorch with ``assert_matches_eager``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from aot_pipeline.models import build_model
from torch import nn


class DropoutNet(nn.Module):
    """Linear layers with dropout between them (random ops in the joint graph)."""

    def __init__(self, dim: int = 16, p: float = 0.3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.dropout(torch.relu(self.fc1(x)), self.p, training=True)
        return self.fc2(x)


class ViewsAndReductions(nn.Module):
    """Views (view, transpose, permute, slicing) and reductions (sum, amax, mean, var)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, d = x.shape
        h = self.fc(x).view(b, 4, d // 4).transpose(1, 2)
        s = h.sum(dim=1, keepdim=True)
        m = h.amax(dim=-1, keepdim=True)
        y = (h - m).exp() / s.abs().add(1.0)
        y = y.permute(0, 2, 1).reshape(b, d)[:, : d // 2]
        return y.mean(-1, keepdim=True) + y.var(-1, keepdim=True) + torch.tanh(y)


@dataclass
class ZooCase:
    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    random: bool = False  # outputs depend on RNG state (dropout): compared under equal seeds

    def fresh(self) -> ZooCase:
        """An independent deep copy (parameters and inputs), for a second run."""
        return ZooCase(self.name, copy.deepcopy(self.module),
                       tuple(t.clone() for t in self.inputs), self.random)


def _from_builtin(name: str, **kw) -> Callable[[], ZooCase]:
    def make() -> ZooCase:
        built = build_model(name, **kw)
        return ZooCase(name if not kw else f"{name}-{'-'.join(f'{k}{v}' for k, v in kw.items())}",
                       built.module, built.make_inputs())
    return make


def _custom(name: str, cls: type[nn.Module], shape: tuple[int, ...], random: bool = False):
    def make() -> ZooCase:
        torch.manual_seed(0)
        module = cls()
        return ZooCase(name, module, (torch.randn(*shape),), random)
    return make


ZOO: dict[str, Callable[[], ZooCase]] = {
    "mlp": _from_builtin("mlp", dim=16, layers=4),
    "gpt": _from_builtin("gpt", dim=16, heads=2, layers=2, seq=8, vocab=32),
    "gpt_sdpa": _from_builtin("gpt", dim=16, heads=2, layers=2, seq=8, vocab=32, sdpa=True),
    "llama": _from_builtin("llama", dim=16, heads=2, layers=2, seq=8, vocab=32, hidden=32),
    "convnet": _from_builtin("convnet", channels=4, layers=2, image=8),
    "dropout": _custom("dropout", DropoutNet, (4, 16), random=True),
    "views": _custom("views", ViewsAndReductions, (4, 16)),
}


def make_case(name: str) -> ZooCase:
    return ZOO[name]()


def loss_of(output) -> torch.Tensor:
    """A scalar loss that touches every output element."""
    outs = output if isinstance(output, (tuple, list)) else (output,)
    return sum(o.float().pow(2).mean() for o in outs if isinstance(o, torch.Tensor))


def run_with_grads(module: nn.Module, inputs, call=None, seed: int = 1234):
    """Run forward and backward; return (outputs, {param name: grad}, [input grads])."""
    call = module if call is None else call
    inputs = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs)
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = call(*inputs)
    loss_of(out).backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    in_grads = [t.grad for t in inputs if t.grad is not None]
    return out, grads, in_grads


def assert_matches_eager(case: ZooCase, compile_fn: Callable[[nn.Module], Callable],
                         atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """``compile_fn(module)`` must compute eager's outputs, parameter grads, input grads and
    buffers (batch-norm running stats).

    Eager and compiled each run on their own deep copy of the module, with the same seed right
    before the forward: on CPU eager and AOTAutograd draw the same dropout masks, so random
    cases are compared exactly too (a recomputed random op must replay the forward's draw).
    """
    eager = case.fresh()
    compiled = case.fresh()
    ref_out, ref_grads, ref_in = run_with_grads(eager.module, eager.inputs)
    out, grads, in_grads = run_with_grads(compiled.module, compiled.inputs,
                                          call=compile_fn(compiled.module))
    torch.testing.assert_close(out, ref_out, atol=atol, rtol=rtol)
    assert grads.keys() == ref_grads.keys(), (sorted(grads), sorted(ref_grads))
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=atol, rtol=rtol,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")
    for got, want in zip(in_grads, ref_in):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    ref_buffers = dict(eager.module.named_buffers())
    for name, buffer in compiled.module.named_buffers():
        torch.testing.assert_close(buffer, ref_buffers[name], atol=atol, rtol=rtol,
                                   msg=lambda m, name=name: f"buffer {name}: {m}")


def checkpoint_policy(must_save=(), must_recompute=(), default=None):
    """A selective-checkpoint policy: ops whose packet is in ``must_save`` are MUST_SAVE, in
    ``must_recompute`` MUST_RECOMPUTE, the rest ``default`` (PREFER_RECOMPUTE)."""
    from torch.utils.checkpoint import CheckpointPolicy

    default = CheckpointPolicy.PREFER_RECOMPUTE if default is None else default

    def policy_fn(ctx, op, *args, **kwargs):
        packet = getattr(op, "overloadpacket", op)
        if packet in must_save:
            return CheckpointPolicy.MUST_SAVE
        if packet in must_recompute:
            return CheckpointPolicy.MUST_RECOMPUTE
        return default
    return policy_fn
