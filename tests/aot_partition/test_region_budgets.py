"""Per-region memory budgets: torch's region_activation_memory_budget and ours, several per graph.

Joints are captured under torch.compile (the annotation only exists there); each case is
partitioned by ours and, where torch accepts it, by torch's partitioner. Each region's saved
bytes are measured from the forward graph's saved outputs, by the joint's annotations.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from aot_partition import FlagConflictError, UnreachableMemoryBudgetError, region_memory_budget
from aot_partition.fx.regions import BYTES_REGION_KEY, TORCH_REGION_KEY, parse_region_budget
from aot_partition.fx.sizes import node_nbytes
from aot_partition.partitioners import min_cut_rematerialization_partition, partition_with_report
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._functorch import config as torch_config
from torch._functorch import partitioners as torch_partitioners
from torch.multiprocessing.reductions import StorageWeakRef

pytestmark = pytest.mark.skipif(
    not hasattr(torch.autograd.graph, "region_activation_memory_budget"),
    reason="torch.autograd.graph.region_activation_memory_budget needs torch 2.13+")

DIM = 64
TENSOR = DIM * DIM * 4  # bytes of one activation


def _region(budget):
    # torch's context manager refuses eager mode: the eager reference runs without regions.
    if budget is None or not torch.compiler.is_compiling():
        return contextlib.nullcontext()
    if isinstance(budget, float):  # torch's own API for fractions
        return torch.autograd.graph.region_activation_memory_budget(budget)
    return region_memory_budget(budget)


def _chain(budgets, whole=None):
    """Blocks of matmul -> relu -> sin -> cos, block i under region budgets[i]; ``whole``: one
    region around everything, the loss included."""
    def fn(x, *weights):
        with _region(whole):
            h = x
            for w, budget in zip(weights, budgets):
                with _region(budget):
                    h = torch.relu(h @ w).sin().cos()
            return h.sum()
    return fn


def _inputs(blocks, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(DIM, DIM, generator=gen, requires_grad=True) for _ in range(blocks + 1)]


def _nop(gm, _inputs):
    return make_boxed_func(gm)


def capture(fn, inputs):
    """(joint, num_fwd_outputs) of ``fn`` as torch.compile hands it to the partitioner."""
    seen = []

    def recording(joint, joint_inputs, **kwargs):
        seen.append((copy.deepcopy(joint), kwargs["num_fwd_outputs"]))
        return torch_partitioners.default_partition(joint, joint_inputs, **kwargs)

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=_nop, bw_compiler=_nop,
                                           partition_fn=recording), fullgraph=True)(*inputs)
    assert len(seen) == 1
    return seen[0]


def saved_outputs(fw, num_fwd_outputs):
    out = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    return [n for n in out[num_fwd_outputs:]
            if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]


def _storage(node):
    return StorageWeakRef(node.meta["val"].untyped_storage())


def region_bytes(joint, fw, num_fwd_outputs):
    """Saved bytes by the region annotation of the joint node each saved value came from;
    inputs and views of them (a transposed weight) keep nothing new alive and count 0."""
    inputs = {_storage(p) for p in fw.graph.find_nodes(op="placeholder")
              if isinstance(p.meta.get("val"), torch.Tensor)}
    budget_of = {}
    for node in joint.graph.nodes:
        custom = node.meta.get("custom") or {}
        budget_of[node.name] = custom.get(TORCH_REGION_KEY, custom.get(BYTES_REGION_KEY))
    totals: dict[object, int] = {}
    for node in saved_outputs(fw, num_fwd_outputs):
        if _storage(node) in inputs:
            continue
        key = budget_of.get(node.name)
        totals[key] = totals.get(key, 0) + node_nbytes(node)
    return totals


def ours(joint, num_fwd_outputs, **flags):
    with torch_config.patch(**flags) if flags else contextlib.nullcontext():
        return partition_with_report(copy.deepcopy(joint), num_fwd_outputs=num_fwd_outputs)


def torch_saved(joint, num_fwd_outputs, **flags):
    with torch_config.patch(**flags) if flags else contextlib.nullcontext():
        fw, _ = torch_partitioners.min_cut_rematerialization_partition(
            copy.deepcopy(joint), [], num_fwd_outputs=num_fwd_outputs)
    return sum(node_nbytes(n) for n in saved_outputs(fw, num_fwd_outputs))


def total(fw, num_fwd_outputs):
    return sum(node_nbytes(n) for n in saved_outputs(fw, num_fwd_outputs))


def assert_grads_match_eager(fn, blocks):
    eager_inputs, compiled_inputs = _inputs(blocks, seed=1), _inputs(blocks, seed=1)
    fn(*eager_inputs).backward()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(
        fw_compiler=_nop, bw_compiler=_nop, partition_fn=min_cut_rematerialization_partition))
    compiled(*compiled_inputs).backward()
    for got, want in zip(compiled_inputs, eager_inputs):
        torch.testing.assert_close(got.grad, want.grad)


# ---- one region over the whole forward: torch's case -----------------------------------------

def test_region_zero_over_the_whole_forward_saves_less_than_no_annotation():
    """The bug: a region budget 0.0 around the whole forward saved as much as none."""
    plain, n_plain = capture(_chain([None, None]), _inputs(2))
    annotated, n_annotated = capture(_chain([None, None], whole=0.0), _inputs(2))
    fw_plain, _, _ = ours(plain, n_plain)
    fw_zero, _, report = ours(annotated, n_annotated)
    assert total(fw_zero, n_annotated) < total(fw_plain, n_plain)
    assert report.memory_budget == 0.0 and any("region annotation" in n for n in report.notes)
    # torch's partitioner on the same annotated joint saves the same bytes.
    assert total(fw_zero, n_annotated) == torch_saved(annotated, n_annotated)


def test_region_one_over_the_whole_forward_saves_the_same_as_no_annotation():
    plain, n_plain = capture(_chain([None, None]), _inputs(2))
    annotated, n_annotated = capture(_chain([None, None], whole=1.0), _inputs(2))
    fw_plain, _, _ = ours(plain, n_plain)
    fw_one, _, _ = ours(annotated, n_annotated)
    assert total(fw_one, n_annotated) == total(fw_plain, n_plain)


@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_ported_region_budget_equals_the_global_budget(budget):
    """torch's test: a region over the whole forward behaves as the global config at that
    budget (ours against ours, and against torch's partitioner)."""
    plain, n_plain = capture(_chain([None, None]), _inputs(2))
    annotated, n_annotated = capture(_chain([None, None], whole=budget), _inputs(2))
    fw_region, _, _ = ours(annotated, n_annotated)
    fw_global, _, _ = ours(plain, n_plain, activation_memory_budget=budget)
    assert total(fw_region, n_annotated) == total(fw_global, n_plain)
    assert total(fw_region, n_annotated) == torch_saved(plain, n_plain,
                                                        activation_memory_budget=budget)


def test_ported_region_budget_overrides_the_global_config():
    """torch's test: the region's budget wins over torch's global flag."""
    annotated, n = capture(_chain([None, None], whole=0.0), _inputs(2))
    with torch_config.patch(activation_memory_budget=1.0):
        fw, _, report = ours(annotated, n)
    assert report.memory_budget == 0.0
    assert total(fw, n) == torch_saved(annotated, n, activation_memory_budget=1.0)


def test_ported_partial_and_mixed_annotations_torch_rejects_ours_solves():
    """torch rejects a partial annotation and two budgets in one graph; ours keeps each."""
    partial, n_partial = capture(_chain([0.0, None]), _inputs(2))
    mixed, n_mixed = capture(_chain([0.0, 0.5]), _inputs(2))
    with pytest.raises(RuntimeError, match="must cover the entire forward"):
        torch_saved(partial, n_partial)
    with pytest.raises(RuntimeError, match="conflicting budgets"):
        torch_saved(mixed, n_mixed)
    fw, _, report = ours(partial, n_partial)
    by_region = region_bytes(partial, fw, n_partial)
    assert by_region.get(0.0, 0) == 0          # the region recomputes all it can
    assert by_region.get(None, 0) > 0          # the rest saves at the global budget 1.0
    assert [r.label for r in report.regions] == ["region 0", "rest (global 1)"]


@pytest.mark.skipif(not hasattr(torch.compiler, "nested_compile_region"),
                    reason="torch.compiler.nested_compile_region is missing")
def test_ported_region_budget_covers_invoke_subgraph():
    """torch's test: a region around calls of a nested compile region covers their bodies
    (each body is partitioned on its own, under the region's budget, as torch does)."""

    @torch.compiler.nested_compile_region
    def block(x, w):
        return torch.relu(x @ w).sin().cos()

    def fn(x, w1, w2):
        with _region(0.0):
            return block(block(x, w1), w2).sum()

    seen = []

    def recording(joint, joint_inputs, **kwargs):
        seen.append((copy.deepcopy(joint), kwargs["num_fwd_outputs"]))
        return torch_partitioners.default_partition(joint, joint_inputs, **kwargs)

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=_nop, bw_compiler=_nop,
                                           partition_fn=recording), fullgraph=True)(*_inputs(2))
    assert len(seen) >= 2  # the body and the outer graph
    for joint, n in seen:
        fw, _, report = ours(joint, n)
        assert report.memory_budget == 0.0
        assert total(fw, n) == torch_saved(joint, n)


def test_ported_region_budget_per_graph_across_a_graph_break():
    """torch's test: regions split by a graph break are two graphs, each under its budget."""

    def fn(x, w1, w2):
        with _region(0.0):
            h = torch.relu(x @ w1).sin().cos()
        torch._dynamo.graph_break()
        with _region(1.0):
            return torch.relu(h @ w2).sin().cos().sum()

    seen = []

    def recording(joint, joint_inputs, **kwargs):
        seen.append((copy.deepcopy(joint), kwargs["num_fwd_outputs"]))
        return torch_partitioners.default_partition(joint, joint_inputs, **kwargs)

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=_nop, bw_compiler=_nop,
                                           partition_fn=recording))(*_inputs(2)).backward()
    budgets = []
    for joint, n in seen:
        fw, _, report = ours(joint, n)
        budgets.append(report.memory_budget)
        assert total(fw, n) == torch_saved(joint, n)
    assert budgets == [0.0, 1.0]


# ---- several regions ------------------------------------------------------------------------

CASES = {
    "one region 0.5": [0.5, None],
    "one byte cap": ["10KiB", None, None],
    "two fractions": [0.0, 0.5],
    "fraction and bytes": [0.25, "20KiB"],
    "three regions": [0.0, 0.5, "8KiB"],
    "three byte caps": ["0B", "20KiB", 40000],
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_region_meets_its_own_budget(name):
    budgets = CASES[name]
    joint, n = capture(_chain(budgets), _inputs(len(budgets)))
    fw, _, report = ours(joint, n)
    measured = region_bytes(joint, fw, n)
    outcomes = {r.label: r for r in report.regions}
    for budget in budgets:
        if budget is None:
            continue
        parsed = parse_region_budget(budget)
        outcome = outcomes[f"region {parsed.label}"]
        got = measured.get(parsed.fraction if parsed.fraction is not None else parsed.nbytes, 0)
        assert got == outcome.saved_bytes
        if parsed.nbytes is not None:
            assert got <= parsed.nbytes
        else:
            # Its limit: the fraction of the way from its least to its runtime-optimal bytes.
            span = outcome.runtime_optimal_bytes - outcome.least_bytes
            assert got <= outcome.least_bytes + parsed.fraction * span
            assert outcome.runtime_optimal_bytes >= TENSOR
    # A region under budget < 1 saves less than the runtime-optimal cut does for it.
    assert all(r.saved_bytes < r.runtime_optimal_bytes for r in report.regions
               if r.label.startswith("region"))
    text = report.format()
    assert all(f"{r.label}: saved {r.saved_bytes} bytes" in text for r in report.regions)


@pytest.mark.parametrize("name", ["two fractions", "three regions"])
def test_region_budgets_give_eager_gradients(name):
    budgets = CASES[name]
    assert_grads_match_eager(_chain(budgets), len(budgets))


def test_a_fraction_region_uses_its_room():
    """At 0.5 the region keeps what fits (one tensor of three), at 0.0 nothing: the budget
    moves the decision, it does not just recompute everything."""
    joint, n = capture(_chain([0.0, 0.5]), _inputs(2))
    fw, _, report = ours(joint, n)
    measured = region_bytes(joint, fw, n)
    assert measured.get(0.0, 0) == 0
    assert 0 < measured.get(0.5, 0) <= 1.5 * TENSOR


def test_the_rest_follows_the_global_budget():
    joint, n = capture(_chain([0.5, None, None]), _inputs(3))
    fw_one, _, _ = ours(joint, n)
    fw_zero, _, report = ours(joint, n, activation_memory_budget=0.0)
    rest = [r for r in report.regions if r.label.startswith("rest")][0]
    assert rest.label == "rest (global 0)" and rest.limit_bytes == rest.least_bytes
    assert region_bytes(joint, fw_zero, n).get(None, 0) < region_bytes(joint, fw_one, n)[None]


def test_unreachable_region_byte_cap_names_the_region():
    # The loss's input is materialized for the backward whatever the region: a region holding
    # only a saved value that cannot be recomputed is kept by pinning it with MUST_SAVE.
    joint, n = capture(_chain(["0B", None]), _inputs(2))
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint.graph.nodes:
        if node.name == "relu":
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    with pytest.raises(UnreachableMemoryBudgetError, match=r"region 0 bytes memory budget 0 "
                                                           r"bytes is unreachable"):
        ours(joint, n)


def test_region_budgets_and_a_global_byte_cap_are_refused():
    from aot_config import functorch as functorch_config

    joint, n = capture(_chain([0.5, None]), _inputs(2))
    with functorch_config.patch(activation_memory_budget_bytes=10**6), \
            pytest.raises(ValueError, match="cannot be combined with a global byte cap"):
        ours(joint, n)


@pytest.mark.parametrize("bad", [True, -1, 1.5, float("nan"), "half", "1e400MiB", "５KiB", None])
def test_bad_region_budgets_are_refused(bad):
    with pytest.raises(ValueError, match="region memory budget must be"):
        parse_region_budget(bad)
    if bad is not None:
        with pytest.raises(ValueError, match="region memory budget must be"):
            region_memory_budget(bad)


@pytest.mark.parametrize("good,expected", [(0.25, (0.25, None)), (0, (0.0, None)),
                                           (1, (1.0, None)), (4096, (None, 4096)),
                                           ("64KiB", (None, 65536)), ("1.5kB", (None, 1500))])
def test_region_budget_values(good, expected):
    parsed = parse_region_budget(good)
    assert (parsed.fraction, parsed.nbytes) == expected


def test_nested_fraction_and_byte_regions_are_refused():
    def fn(x, w):
        with region_memory_budget("8KiB"), region_memory_budget(0.5):
            return torch.relu(x @ w).sin().sum()

    joint, n = capture(fn, _inputs(1))
    with pytest.raises(ValueError, match="nest regions of one kind only"):
        ours(joint, n)


def test_flag_conflict_error_is_exported():
    assert issubclass(FlagConflictError, ValueError)


def _with_block_regions(module, budgets):
    """``module`` with its i-th transformer block under region ``budgets[i]`` (a subclass, so
    deep copies keep it and run their own parameters)."""
    for block, budget in zip(module.blocks, budgets):
        base = type(block)

        class RegionalBlock(base):  # type: ignore[misc, valid-type]
            def forward(self, *args, **kwargs):
                with _region(self.region_budget):
                    return super().forward(*args, **kwargs)

        block.__class__ = RegionalBlock
        block.region_budget = budget
    return module


def test_gpt_blocks_under_two_regions_match_eager_and_meet_their_budgets():
    from tests.zoo import assert_matches_eager, make_case

    budgets = [0.0, "2KiB"]
    case = make_case("gpt")
    _with_block_regions(case.module, budgets)
    reports = []

    def partition(joint, joint_inputs, **kwargs):
        fw, bw, report = partition_with_report(
            joint, num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))
        reports.append(report)
        return fw, bw

    def compile_fn(module):
        torch._dynamo.reset()
        return torch.compile(module, backend=aot_autograd(
            fw_compiler=_nop, bw_compiler=_nop, partition_fn=partition))

    assert_matches_eager(case, compile_fn)
    assert all(p.grad is None for p in case.module.parameters())  # the copies ran
    (report,) = reports
    by_label = {r.label: r for r in report.regions}
    assert by_label["region 0"].saved_bytes == 0
    assert 0 < by_label["region 2048 bytes"].saved_bytes <= 2048
    assert by_label["region 0"].runtime_optimal_bytes > 0


# ---- common-subexpression merging keeps regions apart ---------------------------------------

def _twin_blocks(budget_a, budget_b):
    """The same block (x @ w -> relu -> sin -> cos) twice on the same inputs, the first copy
    under region ``budget_a``, the second under ``budget_b``."""
    def fn(x, w):
        with _region(budget_a):
            a = torch.relu(x @ w).sin().cos()
        with _region(budget_b):
            b = torch.relu(x @ w).sin().cos()
        return (a * b).sum()
    return fn


def _forward_mms(fw):
    return len(fw.graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default))


def test_cse_keeps_identical_ops_of_two_regions_apart():
    """Merged, the 1.0 region's copy would vanish into the 0.0 region's (the first) and be
    recomputed too; kept apart, each region meets its own budget: the 0.0 copy saves nothing,
    the 1.0 copy saves what it saves alone (its runtime-optimal bytes)."""
    joint, n = capture(_twin_blocks(0.0, 1.0), _inputs(1))
    fw, _, report = ours(joint, n)
    assert _forward_mms(fw) == 2
    measured = region_bytes(joint, fw, n)
    outcomes = {r.label: r for r in report.regions}
    assert measured.get(0.0, 0) == 0 == outcomes["region 0"].saved_bytes
    assert measured.get(1.0, 0) == outcomes["region 1"].saved_bytes
    assert outcomes["region 1"].saved_bytes == outcomes["region 1"].runtime_optimal_bytes > 0


def test_cse_still_merges_identical_ops_within_one_region():
    joint, n = capture(_twin_blocks(0.5, 0.5), _inputs(1))
    fw, _, _ = ours(joint, n)
    assert _forward_mms(fw) == 1
    plain, n_plain = capture(_twin_blocks(None, None), _inputs(1))
    fw_plain, _, _ = ours(plain, n_plain)
    assert _forward_mms(fw_plain) == 1
