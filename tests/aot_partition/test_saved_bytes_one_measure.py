"""One measure of saved bytes (issue 28, item 4): the report, the memory simulator and
``saved_activation_bytes`` agree on every zoo model; views of inputs cost nothing, views of an
activation its base once; the report names the budget it was given."""

from __future__ import annotations

import copy

import aot_partition
import pytest
import torch
import torch.fx as fx
from aot_partition import explain_partition, saved_bytes
from aot_partition.fx.sizes import forward_saved_outputs, saved_activation_bytes, saved_buffers
from aot_partition.memory_models.simulator import simulate_partition
from aot_partition.partitioners import default_partition
from aot_partition.report.report import GivenBudget, PartitionReport
from aot_partition.report.trace import decisions_page
from functorch.compile import make_boxed_func
from torch.fx.experimental.proxy_tensor import make_fx, py_sym_types
from zoo import ZOO, make_case

aten = torch.ops.aten


def _independent_count(fw: fx.GraphModule, num_fwd_outputs: int) -> int:
    """The definition spelled out on fake storages: distinct storages of the saved outputs
    that no forward input holds, plus 1 byte per symbolic int (4 per float)."""
    inputs = {p.meta["val"].untyped_storage()._cdata for p in fw.graph.find_nodes(op="placeholder")
              if isinstance(p.meta.get("val"), torch.Tensor)}
    storages: dict[int, int] = {}
    syms = 0
    for node in forward_saved_outputs(fw, num_fwd_outputs):
        val = node.meta.get("val")
        if isinstance(val, py_sym_types):
            syms += 4 if isinstance(val, torch.SymFloat) else 1
        elif isinstance(val, torch.Tensor) and val.untyped_storage()._cdata not in inputs:
            storage = val.untyped_storage()
            storages[storage._cdata] = int(storage.nbytes())
    return sum(storages.values()) + syms


@pytest.mark.parametrize("name", sorted(ZOO))
def test_report_simulator_and_forward_agree_on_the_zoo(name, capture, split_with_recording):
    case = make_case(name)
    joint = capture(case.module, *case.inputs)
    from aot_partition.partitioners import partition_with_report

    for budget in (1.0, 0.5, 0.0):
        fw, bw, report = partition_with_report(joint.fresh(), memory_budget=budget,
                                               num_fwd_outputs=joint.num_fwd_outputs)
        timeline = simulate_partition(fw, bw)
        forward = saved_activation_bytes(fw, joint.num_fwd_outputs)
        assert report.saved_bytes == timeline.saved_bytes == forward, (name, budget)
        assert forward == _independent_count(fw, joint.num_fwd_outputs), (name, budget)


def test_a_byte_cap_compares_the_same_measure(capture):
    case = make_case("gpt")
    joint = capture(case.module, *case.inputs)
    full = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    cap = full.saved_bytes // 2
    report = explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                               memory_budget_bytes=cap)
    assert report.activation_bytes == report.saved_bytes <= cap < full.saved_bytes


def _views_graph() -> fx.GraphModule:
    """A forward with a transposed parameter, two views of one activation and a symbolic size
    among its outputs (symbolic batch: a is (s0, 8) float32, 2 x 8 x 4 = 64 bytes)."""
    def forward(w, x):
        a = torch.sin(x)                          # the activation: 64 bytes
        out = (a @ w).sum()
        return out, w.t(), a.view(-1), a.t(), x.size(0)

    w, x = torch.randn(8, 4), torch.randn(2, 8)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    return make_fx(forward, tracing_mode="symbolic")(w, x)


def _node(gm: fx.GraphModule, target: object) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.target == target)


def test_views_of_inputs_are_free_and_views_of_an_activation_count_their_base_once():
    gm = _views_graph()
    activation, weight_t = _node(gm, aten.sin.default), _node(gm, aten.t.default)
    first_view, size = _node(gm, aten.view.default), _node(gm, aten.sym_size.int)
    second_view = next(n for n in gm.graph.nodes
                       if n.target == aten.t.default and n.args[0] is activation)
    assert saved_bytes([weight_t]) == 0                         # a view of the parameter w
    assert saved_bytes([first_view]) == saved_bytes([second_view]) == 64  # the base, whole
    assert saved_bytes([first_view, second_view, activation]) == 64      # once
    assert saved_bytes([size]) == 1                             # a symbolic int: its size
    assert saved_bytes([weight_t, first_view, second_view, size]) == 65
    # One buffer, held by the first saved value that holds it.
    assert [(held.name, nbytes) for held, nbytes in
            saved_buffers([first_view, second_view]).values()] == [(first_view.name, 64)]
    # The forward's saved outputs (past the user output) in the same measure.
    assert saved_activation_bytes(gm, num_fwd_outputs=1) == 65
    # What summing each value's own bytes would say: 128 + 64 + 64 + 1.
    assert sum(aot_partition.node_nbytes(n)
               for n in (weight_t, first_view, second_view, size)) == 257


def _first_line(report: PartitionReport) -> str:
    return report.format().splitlines()[0]


@pytest.fixture(scope="module")
def gpt(capture):
    case = make_case("gpt")
    return capture(case.module, *case.inputs)


def _explain(joint, **kwargs) -> PartitionReport:
    return explain_partition(joint.module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                             **kwargs)


def test_the_report_names_a_fraction(gpt):
    report = _explain(gpt, memory_budget=0.5)
    assert report.budget == GivenBudget("fraction", fraction=0.5)
    assert _first_line(report).startswith("memory budget 0.5, solver ")
    assert decisions_page("min_cut", report)["budget"] == {
        "kind": "fraction", "fraction": 0.5, "saved_bytes_cap": None, "peak_cap": None,
        "peak_fraction": None, "regions": [], "source": None, "describe": "memory budget 0.5"}


def test_the_report_names_a_byte_cap_never_a_fraction(gpt):
    report = _explain(gpt, memory_budget_bytes=2048)
    assert report.budget == GivenBudget("caps", saved_bytes_cap=2048)
    assert _first_line(report).startswith("saved-bytes cap 2.0 KiB (2048 bytes), solver ")
    assert "memory budget" not in report.format()
    page = decisions_page("min_cut", report)["budget"]
    assert (page["kind"], page["saved_bytes_cap"], page["describe"]) == (
        "caps", 2048, "saved-bytes cap 2.0 KiB (2048 bytes)")


def test_the_report_names_a_peak_cap_and_both_caps(gpt):
    peak = _explain(gpt, peak_bytes=10**9)
    assert _first_line(peak).startswith(
        "simulated peak cap 953.7 MiB (1000000000 bytes), solver ")
    both = _explain(gpt, memory_budget_bytes=512, peak_bytes=10**9)
    assert both.given_budget.describe() == (
        "saved-bytes cap 512 bytes and simulated peak cap 953.7 MiB (1000000000 bytes)")


def test_region_and_default_budgets_in_words():
    regions = GivenBudget("regions", regions=("region 0.25", "region 65536 bytes",
                                              "rest (global 1)"))
    assert regions.describe() == (
        "region budgets: region 0.25, region 65536 bytes, rest (global 1)")
    assert GivenBudget("none").describe() == "no memory budget (default partition)"
    assert GivenBudget("fraction", fraction=0.3, source="a MemoryBudgetMode marker"
                       ).describe() == "memory budget 0.3 (from a MemoryBudgetMode marker)"


def test_a_region_partition_names_its_regions():
    from aot_partition import partition_with_report, region_memory_budget
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import partitioners as torch_partitioners

    def fn(x, w0, w1):
        with region_memory_budget(0.5):
            h = torch.relu(x @ w0).sin().cos()
        return torch.relu(h @ w1).sin().cos().sum()

    seen = []

    def recording(joint, joint_inputs, **kwargs):
        seen.append((copy.deepcopy(joint), kwargs["num_fwd_outputs"]))
        return torch_partitioners.default_partition(joint, joint_inputs, **kwargs)

    def nop(gm, _):
        return make_boxed_func(gm)

    torch._dynamo.reset()
    inputs = [torch.randn(16, 16, requires_grad=True) for _ in range(3)]
    torch.compile(fn, backend=aot_autograd(fw_compiler=nop, bw_compiler=nop,
                                           partition_fn=recording), fullgraph=True)(*inputs)
    (joint, n), = seen
    _, _, report = partition_with_report(joint, num_fwd_outputs=n)
    assert report.budget is not None and report.budget.kind == "regions"
    assert _first_line(report).startswith(
        "region budgets: region 0.5, rest (global 1), solver ")


def test_default_partition_report_says_no_budget(gpt):
    from aot_partition.config import PartitionConfig
    from aot_partition.fx.extract import default_saved_values, extract_forward_backward
    from aot_partition.report.report import default_partition_report

    module = gpt.fresh()
    values, syms = default_saved_values(module, gpt.num_fwd_outputs)
    fw, _, values, syms = extract_forward_backward(module, values, syms,
                                                   num_fwd_outputs=gpt.num_fwd_outputs,
                                                   lazy_modules=False)
    report = default_partition_report(values, syms, PartitionConfig(), fw, gpt.num_fwd_outputs)
    assert _first_line(report).startswith(
        "no memory budget (default partition), solver default partition (no budget)")
    fw, _ = default_partition(gpt.fresh(), gpt.inputs, num_fwd_outputs=gpt.num_fwd_outputs)
    assert report.saved_bytes == saved_activation_bytes(fw, gpt.num_fwd_outputs) > 0


def test_partition_with_report_is_public():
    from aot_partition.partitioners import partition_with_report

    assert aot_partition.partition_with_report is partition_with_report
    assert aot_partition.saved_bytes is saved_bytes
    assert {"partition_with_report", "saved_bytes", "GivenBudget"} <= set(aot_partition.__all__)
    assert "partition_with_report" in dir(aot_partition)
