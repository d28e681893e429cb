"""Work a partition skips because its answer is known (issue 28, item 5): each skip fires where
it must (a spy counts the work that did not run) and not where the work is needed, and the
saved set is the one the work would have given.

- the budget search does not make step 2's cut at budget 0 (it recomputes all it can: step 3's
  cut and the knapsack items decide);
- the graphs of a cut the reference check simulated are the partition's graphs (no second
  extraction);
- step estimates of one joint's cuts are memoized by node (``cut_runtime.NodeEstimates``);
- small flow networks take a plain-Python max-flow with scipy's cut (``core.mincut_small``);
- budget 0 estimates no runtime (no knapsack decides there);
- the pointwise op list is torch's, looked up per packet a graph uses;
- budget 0 makes step 3's bans without its cut, and takes the inputs without comparing when
  the final cut saves inputs only (a tie);
- extraction reuses a backward live set found for the same inputs, or for more inputs that
  the backward does not read;
- ``min_cut_rematerialization_partition`` builds no report nobody reads;
- a process imports scipy's graph code only for a network that needs it (the Python flow
  takes block-sized networks until then).
"""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
import torch
import torch.fx as fx
from aot_partition.budget import peak as peak_module
from aot_partition.budget.search import BudgetSearch
from aot_partition.config import PartitionConfig
from aot_partition.core import mincut_scipy
from aot_partition.core.mincut import FlowNetwork
from aot_partition.costs import cut_runtime
from aot_partition.fx import classify as classify_module
from aot_partition.fx import cut as cut_module
from aot_partition.fx.classify import classify
from aot_partition.fx.joint import aten_packet
from aot_partition.fx.prepare import prepared_joint
from aot_partition.partitioners import min_cut_rematerialization_partition, partition_with_report
from torch._functorch import partitioners as torch_partitioners
from zoo import make_case


def count_calls(monkeypatch, owner, name: str, *also) -> list[int]:
    """Wrap ``owner.<name>`` (and the same name on each of ``also``) in a counter of its
    calls; returns the counter (one-element list)."""
    calls = [0]
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    for target in (owner, *also):
        monkeypatch.setattr(target, name, counting)
    return calls


@pytest.fixture(scope="module")
def gpt_joint(capture):
    # Step 2's cut sits at memory ratio 0.76 of it, step 3's at 0.58.
    case = make_case("gpt")
    return capture(case.module, *case.inputs)


def saved_at(joint, budget: float, eager: bool, monkeypatch) -> tuple[list[str], list[str]]:
    """(saved names, options of each cut made) of a budget search at ``budget``; ``eager``
    makes every escalation cut first, as the search did before the skip."""
    made: list[str] = []
    solve = BudgetSearch.solve

    def recording(self, options, dont_ban=None):
        made.append("aggressive" if not options.ban_if_not_in_allowlist
                    else "more" if not options.ban_if_used_far_apart else "optimal")
        return solve(self, options, dont_ban)

    monkeypatch.setattr(BudgetSearch, "solve", recording)
    module = joint.fresh()
    config = PartitionConfig()
    with prepared_joint(module, joint.num_fwd_outputs, config=config):
        info = classify(module, joint.num_fwd_outputs, None)
        search = BudgetSearch.prepare(module.graph, info, config=config)
        if eager:
            search._escalate()
        saved, _ = search.saved_values(budget)
        return [n.name for n in saved], made


def test_fractions_make_both_escalation_cuts(gpt_joint, monkeypatch):
    # Not skipped where step 2's cut fits (0.8): the report explains the saved set by the last
    # cut that made it, which may be step 3's.
    for budget in (0.8, 0.7):
        saved, made = saved_at(gpt_joint, budget, eager=False, monkeypatch=monkeypatch)
        assert made[:3] == ["optimal", "more", "aggressive"]
        assert saved == saved_at(gpt_joint, budget, eager=True, monkeypatch=monkeypatch)[0]


def test_budget_zero_skips_step_two(gpt_joint, monkeypatch):
    saved, made = saved_at(gpt_joint, 0.0, eager=False, monkeypatch=monkeypatch)
    assert "more" not in made and made[:2] == ["optimal", "aggressive"]
    assert saved == saved_at(gpt_joint, 0.0, eager=True, monkeypatch=monkeypatch)[0]


def estimates_at(joint, budget: float, monkeypatch) -> tuple[list[str], int]:
    """(saved names of the partition at ``budget``, estimate_runtime calls it made)."""
    from aot_partition.budget import search as search_module

    calls = [0]
    estimate = search_module.estimate_runtime

    def counting(node, estimator=None):
        calls[0] += 1
        return estimate(node, estimator)

    monkeypatch.setattr(search_module, "estimate_runtime", counting)
    _, _, report = partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                         config=PartitionConfig(memory_budget=budget))
    return sorted(d.name for d in report.saved), calls[0]


def test_budget_zero_estimates_no_runtime(gpt_joint, monkeypatch, caplog):
    # At 0 every knapsack item is recomputed whatever it costs: no estimate (the log line that
    # reports the recompute runtime is the only reader, and makes them when it is on).
    saved, calls = estimates_at(gpt_joint, 0.0, monkeypatch)
    assert calls == 0
    with caplog.at_level("INFO", logger="aot_partition.partitioners"):
        logged_saved, logged_calls = estimates_at(gpt_joint, 0.0, monkeypatch)
    assert logged_calls > 0 and logged_saved == saved
    assert "memory budget 0.000" in caplog.text and "recompute runtime" in caplog.text
    # the search's own answer at 0, which estimates them
    assert saved == sorted(saved_at(gpt_joint, 0.0, eager=True, monkeypatch=monkeypatch)[0])
    # and where the knapsack decides, the items are estimated
    assert estimates_at(gpt_joint, 0.5, monkeypatch)[1] > 0


# ---- the simulated graphs are the partition's ------------------------------------------------

def count_extractions(monkeypatch) -> list[int]:
    import aot_partition.partitioners as partitioners

    return count_calls(monkeypatch, peak_module, "extract_cut", partitioners)


def partition(joint, budget: float):
    return partition_with_report(joint.fresh(), num_fwd_outputs=joint.num_fwd_outputs,
                                 memory_budget=budget, config=PartitionConfig())


def test_checked_cuts_are_simulated_on_plans_and_the_chosen_one_planned_once(gpt_joint,
                                                                              monkeypatch):
    fw, bw, report = partition(gpt_joint, 0.4)  # the reference check simulates distinct cuts
    assert report.reference_check is not None and not report.reference_check.same_cut
    simulated = len(report.reference_check.scores)
    extractions = count_extractions(monkeypatch)
    plans = count_calls(monkeypatch, peak_module, "plan_cut")
    fw_planned, bw_planned, _ = partition(gpt_joint, 0.4)
    # No simulated cut is extracted; the chosen one is, once, from the plan simulated.
    assert (extractions[0], plans[0]) == (1, simulated)
    monkeypatch.setattr(peak_module.SimulatedPeak, "plan", lambda self, saved: None)
    fw_again, bw_again, _ = partition(gpt_joint, 0.4)
    assert (extractions[0], plans[0]) == (2, 2 * simulated)  # extraction plans it itself
    assert (fw_planned.code, bw_planned.code) == (fw_again.code, bw_again.code) == (fw.code,
                                                                                    bw.code)


def test_unsimulated_cut_is_extracted(gpt_joint, monkeypatch):
    calls = count_extractions(monkeypatch)
    partition(gpt_joint, 1.0)  # no reference check: nothing was simulated
    assert calls[0] == 1


# ---- step estimates memoized by node ---------------------------------------------------------

def tiny_graph(target) -> fx.Graph:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(64, 64)
    y = graph.call_function(target, (x, x))
    y.meta["val"] = torch.empty(64, 64)
    graph.output(y)
    return graph


def test_node_estimates_reuse_a_copy_and_not_another_op(monkeypatch):
    calls: list[str] = []
    estimate = cut_runtime.estimate_runtime

    def counting(node, estimator=None, **kwargs):
        calls.append(node.name)
        return estimate(node, estimator, **kwargs)

    monkeypatch.setattr(cut_runtime, "estimate_runtime", counting)
    estimates = cut_runtime.NodeEstimates("flops")
    mm, copy_of_mm, add = (tiny_graph(t) for t in (torch.ops.aten.mm.default,
                                                   torch.ops.aten.mm.default,
                                                   torch.ops.aten.add.Tensor))
    for graph in (copy_of_mm, mm):  # same name, target and value object in both: one estimate
        node = next(n for n in graph.nodes if n.op == "call_function")
        node.meta["val"] = next(n for n in mm.nodes if n.op == "call_function").meta["val"]
    first = cut_runtime.step_estimate(mm, fx.Graph(), "flops", estimates)
    assert cut_runtime.step_estimate(copy_of_mm, fx.Graph(), "flops", estimates) == first
    assert len(calls) == 1
    # the same name on another op is estimated again, and differs
    assert cut_runtime.step_estimate(add, fx.Graph(), "flops", estimates) != first
    assert len(calls) == 2
    assert first == cut_runtime.step_estimate(mm, fx.Graph(), "flops") == 2 * 64**3


# ---- small networks' max-flow ----------------------------------------------------------------

def random_network(rng: np.random.Generator, nodes: int, edges: int) -> FlowNetwork:
    tails = rng.integers(0, nodes - 1, edges)
    heads = np.minimum(tails + rng.integers(1, 4, edges), nodes - 1)
    capacities = rng.choice([1.0, 3.0, 3.0, 0.25, 1e13, math.inf], edges)
    return FlowNetwork(nodes, 0, nodes - 1, tails, heads, capacities,
                       [str(i) for i in range(nodes)])


def test_small_networks_take_the_python_flow_with_scipys_cut(monkeypatch):
    rng = np.random.default_rng(0)
    networks = [random_network(rng, int(rng.integers(3, 30)), int(rng.integers(2, 90)))
                for _ in range(150)]
    small = [mincut_scipy.scipy_min_cut(net) for net in networks]
    monkeypatch.setattr(mincut_scipy, "SMALL_NETWORK_MAX_EDGES", -1)
    monkeypatch.setattr(mincut_scipy, "COLD_NETWORK_MAX_EDGES", -1)  # scipy even if unloaded
    calls = [0]
    monkeypatch.setattr(mincut_scipy, "sink_side_small",
                        lambda *a: calls.__setitem__(0, calls[0] + 1))
    by_scipy = [mincut_scipy.scipy_min_cut(net) for net in networks]
    assert calls[0] == 0  # over the threshold: scipy's flow
    finite = 0
    for a, b in zip(small, by_scipy):
        assert a.value == b.value
        assert np.array_equal(a.source_side, b.source_side)
        finite += math.isfinite(a.value)
    assert finite > 50  # most networks have a finite cut (no path of infinite edges)


def test_small_path_fires_under_the_threshold(monkeypatch):
    calls = count_calls(monkeypatch, mincut_scipy, "sink_side_small")
    monkeypatch.setattr(mincut_scipy, "COLD_NETWORK_MAX_EDGES", -1)  # scipy even if unloaded
    mincut_scipy.scipy_min_cut(random_network(np.random.default_rng(1), 10, 20))
    assert calls[0] == 1
    big = random_network(np.random.default_rng(2), 200,
                         mincut_scipy.SMALL_NETWORK_MAX_EDGES + 100)
    mincut_scipy.scipy_min_cut(big)
    assert calls[0] == 1


# ---- the pointwise op list -------------------------------------------------------------------

def _aten_packets() -> list:
    aten = torch.ops.aten
    return [p for p in (getattr(aten, n) for n in dir(aten))
            if isinstance(p, torch._ops.OpOverloadPacket)]


@pytest.mark.parametrize("has_op_overloads", [True, False])
def test_is_pointwise_agrees_with_torchs_pointwise_ops(monkeypatch, has_op_overloads):
    theirs = list(torch_partitioners.pointwise_ops())
    if not has_op_overloads:  # a torch release without OpOverloadPacket.op_overloads
        monkeypatch.delattr(torch._ops.OpOverloadPacket, "op_overloads", raising=False)
    ours = [p for p in _aten_packets() if classify_module.is_pointwise(p)]
    assert ours and ours == theirs
    assert not classify_module.is_pointwise(torch.ops.prims.sin)  # torch lists aten only
    assert not classify_module.is_pointwise(operator.getitem)


def test_default_op_types_look_pointwise_up_per_packet(gpt_joint, monkeypatch):
    """default_op_types() no longer lists the 1,300 aten packets up front: each packet a graph
    uses is checked for the pointwise tag on first sight, with the same answer as the
    list torch builds (``get_default_op_list``) on every aten packet."""
    checked: list[object] = []
    is_pointwise = classify_module.is_pointwise

    def counting(packet):
        checked.append(packet)
        return is_pointwise(packet)

    monkeypatch.setattr(classify_module, "is_pointwise", counting)
    classify_module.default_op_types.cache_clear()
    try:
        ops = classify_module.default_op_types()
        assert checked == []  # building the tables checks nothing
        partition_with_report(gpt_joint.fresh(), num_fwd_outputs=gpt_joint.num_fwd_outputs,
                              config=PartitionConfig(memory_budget=0.5))
        nodes = list(gpt_joint.module.graph.nodes)
        # at most once per op the graph uses (the answers are memoized by target), and only
        # those: not the 1,300 aten packets
        assert checked and len(checked) <= len({n.target for n in nodes})
        assert set(checked) <= {aten_packet(n) for n in nodes}
        checked.clear()
        differ = [str(p) for p in _aten_packets()
                  if ops.recomputes(p) != (p in torch_recomputable())]
    finally:
        classify_module.default_op_types.cache_clear()
    # the few we list beyond torch (2.13's additions) and nothing else
    assert set(differ) <= {str(p) for p in ops.recomputable_ops}, differ
    aten = torch.ops.aten
    assert ops.recomputes(aten.sin) and ops.recomputes(aten.add)  # pointwise: must fire
    assert not ops.recomputes(aten.mm) and not ops.recomputes(aten.convolution)  # must not


def torch_recomputable() -> set:
    return set(torch_partitioners.get_default_op_list().recomputable_ops)


# ---- budget 0: step 3's bans without its cut; an inputs-only tie without a walk -------------

def cuts_at(joint, budget: float, monkeypatch) -> tuple[list[str], list[tuple[str, bool]], int]:
    """(saved names, (options, whether bans were lifted) of each cut made, ban-only calls) of a
    partition at ``budget``."""
    from aot_partition.budget import search as search_module

    made: list[tuple[str, bool]] = []
    solve = BudgetSearch.solve

    def recording(self, options, dont_ban=None):
        made.append(("aggressive" if not options.ban_if_not_in_allowlist
                     else "more" if not options.ban_if_used_far_apart else "optimal",
                     bool(dont_ban)))
        return solve(self, options, dont_ban)

    monkeypatch.setattr(BudgetSearch, "solve", recording)
    ban_calls = count_calls(monkeypatch, search_module, "min_cut_bans")
    fw, _ = min_cut_rematerialization_partition(joint.fresh(), None,
                                                num_fwd_outputs=joint.num_fwd_outputs,
                                                config=PartitionConfig(memory_budget=budget))
    output = next(iter(fw.graph.find_nodes(op="output")))
    saved = sorted(str(v) for v in output.args[0][joint.num_fwd_outputs:])
    monkeypatch.undo()
    return saved, made, ban_calls[0]


def test_budget_zero_makes_step_three_bans_without_its_cut(gpt_joint, monkeypatch):
    saved, made, ban_calls = cuts_at(gpt_joint, 0.0, monkeypatch)
    # the optimal cut, then the final one with every knapsack item released; step 3's own
    # cut (nothing released) is not made, its bans are
    assert made == [("optimal", False), ("aggressive", True)] and ban_calls == 1
    assert saved == sorted(saved_at(gpt_joint, 0.0, eager=True, monkeypatch=monkeypatch)[0])
    # where the knapsack decides, step 3's cut is made
    _, made, _ = cuts_at(gpt_joint, 0.5, monkeypatch)
    assert ("aggressive", False) in made


class TwoConvs(torch.nn.Module):
    """Activations far bigger than the weights: at budget 0 the final cut is inputs only."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3)
        self.conv2 = torch.nn.Conv2d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x)))).sum()


def walks_at_zero(joint, monkeypatch, shortcut: bool) -> tuple[list[str], int]:
    """(saved names at budget 0, backward walks the search made); ``shortcut=False`` makes
    the search compare by walking, as it did before the skip."""
    from aot_partition.budget import search as search_module

    walks = count_calls(monkeypatch, search_module, "backward_live_nodes")
    if not shortcut:  # no cut counts as inputs only: the byte comparison decides
        monkeypatch.setattr(search_module, "saves_inputs_only", lambda cut, inputs: False)
    saved, _ = saved_at(joint, 0.0, eager=False, monkeypatch=monkeypatch)
    monkeypatch.undo()
    return sorted(saved), walks[0]


def test_inputs_only_tie_needs_no_walk(capture, monkeypatch):
    joint = capture(TwoConvs(), torch.randn(2, 3, 16, 16))
    saved, walks = walks_at_zero(joint, monkeypatch, shortcut=True)
    compared, compare_walks = walks_at_zero(joint, monkeypatch, shortcut=False)
    assert walks == 0 and compare_walks == 2
    assert saved == compared and all(name.startswith("primals") for name in saved)
    # a cut that saves an intermediate (the GPT's transposed weights) is still compared
    case = make_case("gpt")
    _, gpt_walks = walks_at_zero(capture(case.module, *case.inputs), monkeypatch, shortcut=True)
    assert gpt_walks == 2


# ---- extraction: a backward live set is found once ------------------------------------------

def backward_walks_in_partition(joint, budget: float, monkeypatch, reuse: bool
                                ) -> tuple[int, str, str]:
    """(backward live-set walks of one partition, forward code, backward code); ``reuse=False``
    turns both reuses off (every extraction walks, as before)."""
    from aot_partition.fx import extract

    walks = [0]
    needed = extract._needed_nodes

    def counting(graph, inputs, outputs, *, backward=False):
        walks[0] += backward
        return needed(graph, inputs, outputs, backward=backward)

    monkeypatch.setattr(extract, "_needed_nodes", counting)
    if not reuse:
        monkeypatch.setattr(extract, "_same_live_set", lambda *args: False)
        extract_graphs = extract.extract_forward_backward_graphs
        monkeypatch.setattr(cut_module, "extract_forward_backward_graphs",
                            lambda *a, known_live=None, **k: extract_graphs(*a, **k))
    fw, bw = min_cut_rematerialization_partition(joint.fresh(), None,
                                                 num_fwd_outputs=joint.num_fwd_outputs,
                                                 config=PartitionConfig(memory_budget=budget))
    monkeypatch.undo()
    return walks[0], fw.code, bw.code


def test_extraction_reuses_the_searchs_live_set(gpt_joint, monkeypatch):
    # At 0 the search walks the backward of its final cut and of the inputs (2), and the
    # extraction of the chosen one takes that walk's live set.
    walks, fw, bw = backward_walks_in_partition(gpt_joint, 0.0, monkeypatch, reuse=True)
    before, fw_before, bw_before = backward_walks_in_partition(gpt_joint, 0.0, monkeypatch,
                                                               reuse=False)
    assert (walks, before) == (2, 4) and (fw, bw) == (fw_before, bw_before)
    # at 1.0 nobody walked before extraction: it walks once
    assert backward_walks_in_partition(gpt_joint, 1.0, monkeypatch, reuse=True)[0] == 1


def test_dropping_unread_inputs_keeps_the_live_set(capture, monkeypatch):
    # y's gradient is ones: the backward of an inputs-only cut reads x, not y, so y is dropped
    # from the saved values and the live set found with it is the backward's.
    joint = capture(lambda x, y: (x.sin() * 2).sum() + y.sum(),
                    torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True))
    from aot_partition.fx import extract

    module = joint.fresh()
    placeholders = list(module.graph.find_nodes(op="placeholder"))
    x, y = placeholders[:2]
    tangents = placeholders[2:]
    _, bw_outputs, _, _ = extract.forward_and_backward_outputs(module, joint.num_fwd_outputs)
    live = extract._needed_nodes(module.graph, [x, y, *tangents], bw_outputs, backward=True)
    assert x in live and y not in live
    assert extract._same_live_set([x, y, *tangents], [x, *tangents], live)
    assert live == extract._needed_nodes(module.graph, [x, *tangents], bw_outputs,
                                         backward=True)
    # must not fire: an input added, or a live input dropped
    assert not extract._same_live_set([x, *tangents], [x, y, *tangents], live)
    assert not extract._same_live_set([x, y, *tangents], [y, *tangents], live)
    # and the partition at 0 walks the backward once for both
    walks, fw, bw = backward_walks_in_partition(joint, 0.0, monkeypatch, reuse=True)
    before, fw_before, bw_before = backward_walks_in_partition(joint, 0.0, monkeypatch,
                                                               reuse=False)
    assert walks < before and (fw, bw) == (fw_before, bw_before)


@pytest.mark.parametrize("name", ["gpt", "convnet", "dropout", "views"])
def test_impure_answer_per_op_is_torchs_per_node(name, capture):
    from aot_partition.fx.extract import _is_impure

    case = make_case(name)
    graph = capture(case.module, *case.inputs).fresh().graph
    for impure_random in (True, False):
        by_op: dict = {}
        for node in graph.nodes:
            assert _is_impure(node, impure_random, by_op) == node.is_impure(impure_random), (
                node.name)
        assert by_op  # the aten calls were answered per op


# ---- the report is built only for a reader --------------------------------------------------

def test_report_built_only_when_read(gpt_joint, monkeypatch, caplog):
    import aot_partition.partitioners as partitioners

    built = count_calls(monkeypatch, partitioners, "build_report")
    # torch's lazy trace handler stays until a first trace event finds TORCH_TRACE unset
    monkeypatch.setattr(partitioners, "tracing", lambda: False)
    kwargs = {"num_fwd_outputs": gpt_joint.num_fwd_outputs, "config": PartitionConfig()}
    fw, bw = min_cut_rematerialization_partition(gpt_joint.fresh(), None, **kwargs)
    assert built[0] == 0
    monkeypatch.setattr(partitioners, "tracing", lambda: True)
    monkeypatch.setattr(partitioners, "trace_partition", lambda name, report_fn: report_fn())
    min_cut_rematerialization_partition(gpt_joint.fresh(), None, **kwargs)
    assert built[0] == 1
    monkeypatch.setattr(partitioners, "tracing", lambda: False)
    with caplog.at_level("DEBUG", logger="aot_partition"):
        fw_logged, bw_logged = min_cut_rematerialization_partition(gpt_joint.fresh(), None,
                                                                   **kwargs)
    assert built[0] == 2 and "saved " in caplog.text
    fw_reported, bw_reported, report = partition_with_report(gpt_joint.fresh(), **kwargs)
    assert built[0] == 3 and report.saved
    assert fw.code == fw_logged.code == fw_reported.code
    assert bw.code == bw_logged.code == bw_reported.code


# ---- scipy imported only when a network needs it ----------------------------------------------

def test_cold_process_cuts_block_sized_graphs_without_scipy():
    # A fresh process partitions a 352-node joint (680 flow edges): the Python flow, no scipy
    # import (0.2-0.3 s); the saved values are those of scipy's flow.
    import subprocess
    import sys

    code = (
        "import sys, copy\n"
        "from zoo import make_case\n"
        "from functorch.compile import aot_module\n"
        "from torch._functorch.partitioners import default_partition\n"
        "import aot_partition\n"
        "from aot_partition.core import mincut_scipy\n"
        "case = make_case('gpt'); found = {}\n"
        "def record(joint, inputs, **kw):\n"
        "    found['joint'] = (copy.deepcopy(joint), inputs, kw)\n"
        "    return default_partition(joint, inputs, **kw)\n"
        "aot_module(case.module, fw_compiler=lambda g, i: g, bw_compiler=lambda g, i: g,\n"
        "           partition_fn=record)(*case.inputs)\n"
        "joint, inputs, kw = found['joint']\n"
        "def saved():\n"
        "    fw, _ = aot_partition.min_cut_rematerialization_partition(\n"
        "        copy.deepcopy(joint), inputs, **kw)\n"
        "    out = next(iter(fw.graph.find_nodes(op='output'))).args[0]\n"
        "    return [str(v) for v in out[kw['num_fwd_outputs']:]]\n"
        "python_flow = saved()\n"
        "assert 'scipy.sparse.csgraph' not in sys.modules, 'scipy imported'\n"
        "mincut_scipy.COLD_NETWORK_MAX_EDGES = 0\n"
        "assert saved() == python_flow\n"
        "assert 'scipy.sparse.csgraph' in sys.modules\n"
        "print('ok', len(python_flow))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ,
                                            "PYTHONPATH": __import__("os").pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok ")


def test_cold_flow_stops_when_scipy_is_loaded_or_its_budget_spent(monkeypatch):
    import sys

    net = random_network(np.random.default_rng(3), 300, 700)
    calls = count_calls(monkeypatch, mincut_scipy, "sink_side_small")
    monkeypatch.setattr(mincut_scipy, "_cold_flow_s", 0.0)  # as in a fresh process
    import scipy.sparse.csgraph  # noqa: F401  (loaded: scipy's flow is the cheaper one)

    assert "scipy.sparse.csgraph" in sys.modules
    by_scipy = mincut_scipy.scipy_min_cut(net)
    assert calls[0] == 0
    monkeypatch.delitem(sys.modules, "scipy.sparse.csgraph")  # as in a process without it
    cold = mincut_scipy.scipy_min_cut(net)
    assert calls[0] == 1 and cold.value == by_scipy.value
    assert np.array_equal(cold.source_side, by_scipy.source_side)
    monkeypatch.setattr(mincut_scipy, "_cold_flow_s", mincut_scipy.COLD_FLOW_BUDGET_S)
    mincut_scipy.scipy_min_cut(net)  # the budget is spent: scipy from now on
    big = random_network(np.random.default_rng(4), 600, mincut_scipy.COLD_NETWORK_MAX_EDGES + 1)
    monkeypatch.setattr(mincut_scipy, "_cold_flow_s", 0.0)
    mincut_scipy.scipy_min_cut(big)  # over the cold size: scipy
    assert calls[0] == 1
