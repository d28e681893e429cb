"""Recompute is a pure replay: every class of op whose recompute would not give the forward's
value again, each with a case where the rule must fire and one where it must not."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from aot_config import functorch as functorch_config
from aot_partition import min_cut_rematerialization_partition
from aot_partition.budget.search import BudgetSearch
from aot_partition.fx.classify import classify
from aot_partition.fx.passes.rng import rng_state_nbytes
from aot_partition.fx.passes.rng_ops import run_and_save_rng_state, run_with_rng_state
from aot_partition.fx.policy import never_recompute
from aot_partition.fx.prepare import prepared_joint
from aot_partition.fx.sizes import saved_activation_bytes
from aot_partition.partitioners import partition_with_report
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch import config as torch_config
from torch._functorch.partitioners import (
    min_cut_rematerialization_partition as torch_min_cut_partition,
)
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from zoo import ZooCase, assert_matches_eager

BUDGETS = (1.0, 0.5, 0.0)


def _nop(gm, _):
    return make_boxed_func(gm)


class DropoutBatchNorm(nn.Module):
    """Dropout before and after a training-mode batch norm (both rules in one graph)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.a, self.b, self.bn = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.BatchNorm1d(dim)

    def forward(self, x):
        h = F.dropout(torch.relu(self.a(x)), 0.3, training=True)
        h = F.dropout(torch.tanh(self.b(self.bn(h))), 0.5, training=True)
        return h.sum(-1)


class RandomOps(nn.Module):
    """Every kind of random op a model draws with: dropout, bernoulli (stochastic depth),
    rand_like / randn_like noise, randint_like."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        keep = h.new_empty(h.shape[0], 1).bernoulli_(0.7) / 0.7     # stochastic depth
        h = h * keep + 0.1 * torch.randn_like(h) * torch.rand_like(h)
        h = h + torch.randint_like(h, 0, 3) * 0.01
        h = torch.sigmoid(self.b(F.dropout(h, 0.2, training=True)))
        return h


def _case(module: nn.Module, shape=(32, 64)) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(type(module).__name__, module, (torch.randn(*shape),), random=True)


def aot_at(budget: float, **flags):
    from functorch.compile import aot_module

    def compile_fn(module):
        compiled = aot_module(module, fw_compiler=_nop, bw_compiler=_nop,
                              partition_fn=min_cut_rematerialization_partition)

        def call(*args):
            with functorch_config.patch(activation_memory_budget=budget, **flags):
                return compiled(*args)
        return call
    return compile_fn


def compile_at(budget: float):
    import aot_pipeline  # noqa: F401  (registers the back end)

    def compile_fn(module):
        torch._dynamo.reset()
        return torch.compile(module, backend="aot_pipeline",
                             options={"memory_budget": budget, "compiler": "nop"})
    return compile_fn


def dynamo_joint(module: nn.Module, *inputs):
    """The joint graph as the aot_pipeline back end (and Inductor) hands it to partition_fn:
    input mutations kept in the graph as copy_; with its inputs and num_fwd_outputs."""
    record = {}

    def recording(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        record.update(joint=copy.deepcopy(joint), inputs=joint_inputs, n=num_fwd_outputs)
        return torch_min_cut_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                       **kwargs)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=_nop, bw_compiler=_nop, partition_fn=recording,
                           keep_inference_input_mutations=True)
    torch.compile(copy.deepcopy(module), backend=backend)(*inputs)
    torch._dynamo.reset()
    return record["joint"], record["inputs"], record["n"]


def _partition(joint, n, budget):
    fw, bw, report = partition_with_report(copy.deepcopy(joint), num_fwd_outputs=n,
                                           memory_budget=budget)
    return fw, bw, report


def _targets(module) -> set:
    return {node.target for node in module.graph.nodes}


# ---- random ops ------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("make", [DropoutBatchNorm, RandomOps])
def test_random_ops_equal_eager_at_every_budget(make, budget):
    assert_matches_eager(_case(make()), aot_at(budget))
    assert_matches_eager(_case(make()), compile_at(budget))


def test_aggressive_recomputation_replays_random_ops_too():
    assert_matches_eager(_case(RandomOps()), aot_at(0.0, aggressive_recomputation=True))


def test_recomputed_dropout_replays_the_forward_rng_state(capture):
    case = _case(DropoutBatchNorm())
    joint = capture(case.module, *case.inputs)
    fw, bw, report = _partition(joint.module, joint.num_fwd_outputs, 0.0)
    # Must fire: below the budget both dropouts are recomputed, each on its saved state.
    assert _targets(fw) >= {run_and_save_rng_state}
    replays = [n for n in bw.graph.nodes if n.target is run_with_rng_state]
    assert len(replays) == 2
    assert {d.name for d in report.recomputed} >= {"native_dropout", "native_dropout_1"}
    assert all("replaying the forward's RNG state" in d.reason for d in report.recomputed
               if d.name.startswith("native_dropout"))
    state_bytes = 2 * rng_state_nbytes("cpu")
    assert report.notes == [f"2 recomputed random op(s) replay the forward's RNG state "
                            f"({state_bytes} bytes saved for it): native_dropout, "
                            f"native_dropout_1"]
    # Must not fire at budget 1.0: the masks are saved, no state, no replay.
    fw, bw, report = _partition(joint.module, joint.num_fwd_outputs, 1.0)
    assert run_and_save_rng_state not in _targets(fw)
    assert run_with_rng_state not in _targets(bw)
    assert report.notes == []


class Attention(nn.Module):
    """Self-attention through SDPA, whose op is tagged random for its dropout argument."""

    def __init__(self, dropout_p: float, dim: int = 64) -> None:
        super().__init__()
        self.qkv, self.dropout_p = nn.Linear(dim, 3 * dim), dropout_p

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, -1, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p).sum(-1)


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_attention_is_random_only_with_dropout(capture, dropout_p):
    from aot_partition.fx.joint import is_random

    case = _case(Attention(dropout_p), shape=(512, 64))  # activations outweigh the weights
    joint = capture(case.module, *case.inputs)
    calls = [n for n in joint.module.graph.nodes if n.op == "call_function"]
    seeded = [n for n in calls if torch.Tag.nondeterministic_seeded in
              getattr(n.target, "tags", ())]
    assert seeded  # the attention op (dropout_p 0) or its dropout (CPU decomposes it)
    _, bw, report = _partition(joint.module, joint.num_fwd_outputs, 0.0)
    recomputed = {d.name for d in report.recomputed}
    assert {n.name for n in seeded} <= recomputed
    if dropout_p == 0:
        # The flash attention op is tagged for its dropout argument, which is 0: it draws
        # nothing, so it is recomputed without a replayed RNG state.
        assert [str(n.target) for n in seeded] == [
            "aten._scaled_dot_product_flash_attention_for_cpu.default"]
        assert not any(is_random(n) for n in calls)
        assert run_with_rng_state not in _targets(bw)
    else:
        assert all(is_random(n) for n in seeded)
        assert run_with_rng_state in _targets(bw)
    assert_matches_eager(case, aot_at(0.0))


def test_tiny_random_op_stays_saved_when_its_rng_state_is_bigger(capture):
    # A 16-element mask is 80 bytes; replaying it would save a 5,056-byte CPU RNG state.
    case = _case(DropoutBatchNorm(dim=4), shape=(4, 4))
    joint = capture(case.module, *case.inputs)
    _, bw, report = _partition(joint.module, joint.num_fwd_outputs, 0.0)
    assert run_with_rng_state not in _targets(bw)
    assert not any(d.name.startswith("native_dropout") for d in report.recomputed)
    assert_matches_eager(case, aot_at(0.0))


def test_random_op_with_its_own_generator_is_never_recomputed(capture):
    case = _case(RandomOps())
    joint = capture(case.module, *case.inputs)
    module = joint.fresh()
    noise = next(n for n in module.graph.nodes if n.target is torch.ops.aten.randn_like.default)
    noise.kwargs = {**noise.kwargs, "generator": torch.Generator()}
    reason = ("random op with its own generator: only the default generator's state can be "
              "replayed")
    assert never_recompute(noise) == reason
    # fx cannot print a Generator into code: keep the modules lazy, as torch.compile does.
    with _use_lazy_graph_module(True):
        _, _, report = partition_with_report(module, num_fwd_outputs=joint.num_fwd_outputs,
                                             memory_budget=0.0)
    assert report.banned[noise.name] == reason
    assert noise.name not in {d.name for d in report.recomputed}
    # The replayable ones are recomputed at the same budget (the rule fires only here).
    assert "native_dropout" in {d.name for d in report.recomputed}
    with prepared_joint(module, joint.num_fwd_outputs):
        search = BudgetSearch.prepare(module.graph, classify(module, joint.num_fwd_outputs))
        search.saved_values(0.5)
        assert noise not in search.candidates


def test_random_op_on_a_device_without_rng_replay_is_never_recomputed():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4, device="meta")
    noise = graph.call_function(torch.ops.aten.rand_like.default, (x,))
    noise.meta["val"] = torch.empty(4, device="meta")
    assert never_recompute(noise) == "random op on meta: its RNG state cannot be replayed"
    relu = graph.call_function(torch.ops.aten.relu.default, (x,))
    relu.meta["val"] = torch.empty(4, device="meta")
    assert never_recompute(relu) is None


# ---- effectful ops and asserts ---------------------------------------------------------------

def _printing(x):
    y = torch.sin(x)
    torch.ops.aten._print("side effect")
    return (y * y).sum()


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_effectful_op_runs_once_per_step(budget, capfd):
    import aot_pipeline  # noqa: F401

    torch._dynamo.reset()
    compiled = torch.compile(_printing, backend="aot_pipeline",
                             options={"memory_budget": budget, "compiler": "nop"})
    x = torch.randn(8, requires_grad=True)
    capfd.readouterr()
    for _ in range(3):
        compiled(x).backward()
    assert capfd.readouterr().out.count("side effect") == 3
    ref = x.detach().clone().requires_grad_()
    torch.sin(ref).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, 3 * ref.grad)


def test_effectful_op_is_never_recomputed(capture):
    joint = capture(_printing, torch.randn(8, requires_grad=True))
    effect = next(n for n in joint.module.graph.nodes
                  if n.target is torch.ops.higher_order.with_effects)
    assert never_recompute(effect) == "effectful op: recomputing would repeat its side effect"
    _, bw, _ = _partition(joint.module, joint.num_fwd_outputs, 0.0)
    assert torch.ops.higher_order.with_effects not in _targets(bw)


class Reshaped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        b = x.shape[0]
        torch._check(b >= 2)
        return torch.tanh(self.fc(x)).view(b // 2, 2, 8).sum(1)


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_asserts_stay_in_the_forward_with_dynamic_shapes(budget):
    import aot_pipeline  # noqa: F401

    model = Reshaped()
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="aot_pipeline", dynamic=True,
                             options={"memory_budget": budget, "compiler": "nop"})
    for batch in (4, 6, 10):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(compiled(x), model(x))
    record = {}

    def recording(j, ji, *, num_fwd_outputs, **kw):
        record.update(joint=copy.deepcopy(j), n=num_fwd_outputs)
        return min_cut_rematerialization_partition(j, ji, num_fwd_outputs=num_fwd_outputs, **kw)

    torch._dynamo.reset()
    x = torch.randn(6, 8, requires_grad=True)
    torch.compile(copy.deepcopy(model), dynamic=True,
                  backend=aot_autograd(fw_compiler=_nop, bw_compiler=_nop,
                                       partition_fn=recording))(x).sum().backward()
    joint, n = record["joint"], record["n"]
    asserts = [t for t in _targets(joint) if "_assert" in str(t)]
    if not asserts:  # torch 2.11 checks these sizes outside the joint graph
        pytest.skip(f"torch {torch.__version__} puts no shape asserts in the joint graph")
    fw, bw, _ = _partition(joint, n, budget)
    assert set(asserts) <= _targets(fw)
    assert not set(asserts) & _targets(bw)


# ---- inputs updated in place -----------------------------------------------------------------

class Conv(nn.Module):
    def __init__(self, p: float = 0.3) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)
        self.p = p

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.head(F.dropout(h.mean((2, 3)), self.p, training=True))


def _bn_nodes(module):
    return [n for n in module.graph.nodes if "batch_norm" in str(n.target)
            and "backward" not in str(n.target)]


def test_batch_norm_is_recomputed_when_its_stats_are_updated_in_the_graph():
    # torch.compile keeps the running-stat update in the graph (copy_): the batch norm's
    # output does not read the stats, so recomputing it is correct; torch does it too.
    torch.manual_seed(0)
    model, x = Conv(), torch.randn(4, 3, 8, 8)
    joint, inputs, n = dynamo_joint(model, x)
    assert torch.ops.aten.copy_.default in _targets(joint)
    fw, bw, _ = _partition(joint, n, 0.0)
    assert _bn_nodes(bw), "the rule must not fire: batch norm recomputable"
    assert torch.ops.aten.copy_.default not in _targets(bw)   # the update runs once
    # Without dropout (torch recomputes dropout without replaying it, saving less for a wrong
    # answer) we save no more than torch under the budget: the batch norm rule costs nothing.
    joint_no_dropout, inputs, n = dynamo_joint(Conv(p=0.0), x)
    with torch_config.patch(activation_memory_budget=0.5):
        torch_fw, _ = torch_min_cut_partition(copy.deepcopy(joint_no_dropout), inputs,
                                              num_fwd_outputs=n)
    ours_fw, _, _ = _partition(joint_no_dropout, n, 0.5)
    assert saved_activation_bytes(ours_fw, n) <= saved_activation_bytes(torch_fw, n)
    for budget in BUDGETS:
        assert_matches_eager(ZooCase("conv", copy.deepcopy(model), (x,), True),
                             compile_at(budget))


def test_batch_norm_stays_in_the_forward_when_the_runtime_writes_its_stats_back(capture):
    # aot_module without keep_inference_input_mutations: the runtime copies the new stats
    # into the buffers after the forward; a recompute would trip autograd's version check.
    torch.manual_seed(0)
    model, x = Conv(), torch.randn(4, 3, 8, 8)
    joint = capture(model, x)
    assert torch.ops.aten.copy_.default not in _targets(joint.module)
    _, bw, report = _partition(joint.module, joint.num_fwd_outputs, 0.0)
    assert not _bn_nodes(bw), "the rule must fire: batch norm kept in the forward"
    assert report.banned[_bn_nodes(joint.module)[0].name] == "MUST_SAVE annotation"
    assert_matches_eager(ZooCase("conv", copy.deepcopy(model), (x,), True), aot_at(0.0))


class MutatedBuffer(nn.Module):
    """A value read from a buffer that the forward then updates in place (not batch norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        h = torch.tanh(self.fc(x)) * self.scale.exp()
        with torch.no_grad():
            self.scale.add_(0.25)
        return torch.sigmoid(h)


@pytest.mark.parametrize("budget", BUDGETS)
def test_reader_of_a_buffer_updated_in_the_graph_is_never_recomputed(budget):
    torch.manual_seed(0)
    model, x = MutatedBuffer(), torch.randn(4, 16)
    joint, _, n = dynamo_joint(model, x)
    exp = next(node for node in joint.graph.nodes if node.target is torch.ops.aten.exp.default)
    _, bw, report = _partition(joint, n, budget)
    assert exp.name not in {node.name for node in bw.graph.nodes if node.op == "call_function"}
    assert report.banned[exp.name] == "MUST_SAVE annotation"
    assert_matches_eager(ZooCase("buffer", copy.deepcopy(model), (x,)), compile_at(budget))
