"""Many ranks (issue 26): no collective recomputed, one decision on every rank, DDP and FSDP2.

The rank tests start 2 real gloo ranks on this machine (``ranks.run_ranks``, each call under a
timeout, so a hang fails); their rank-side functions live in ``tests/dist_cases_spmd.py``. Each
start costs about 10 s of imports, so each call runs several variants; a module-scoped fixture
shares one call between the tests that read it. The other tests run in this process, without a
process group.
"""

from __future__ import annotations

import operator
import re

import pytest
import torch
import torch.fx as fx
from aot_config import functorch as functorch_config
from aot_partition.config import MinCutOptions, PartitionConfig
from aot_partition.core.milp_limits import MILP_NODES_PER_SECOND, milp_limits, stopped_by_limit
from aot_partition.costs import estimators, spmd
from aot_partition.fx.collectives import COLLECTIVE_REASON, collective_seconds, wire_bytes
from aot_partition.fx.policy import active_ban_rules, collective, never_released
from ranks import RanksFailed, run_ranks

c10d = torch.ops._c10d_functional
# The forward's collectives of dist_cases_spmd.collective_block: 3 collectives, 3 waits.
BLOCK_COLLECTIVES = ["all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor",
                     "wait_tensor", "wait_tensor_1", "wait_tensor_2"]


# ---- in this process: the rule, the price, the limits ------------------------------------------

def _collective_graph() -> tuple[fx.Graph, dict[str, fx.Node]]:
    """x (1 MiB of float32) -> all_reduce -> wait, and all_gather over 4 ranks -> wait, relu."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(256, 1024)
    nodes = {"x": x}
    calls = {
        "all_reduce": (c10d.all_reduce.default, (x, "sum", "0"), torch.empty(256, 1024)),
        "all_gather": (c10d.all_gather_into_tensor.default, (x, 4, "0"),
                       torch.empty(1024, 1024)),
        "reduce_scatter": (c10d.reduce_scatter_tensor.default, (x, "sum", 4, "0"),
                           torch.empty(64, 1024)),
        "broadcast": (c10d.broadcast.default, (x, 0, "0"), torch.empty(256, 1024)),
        "relu": (torch.ops.aten.relu.default, (x,), torch.empty(256, 1024)),
    }
    for name, (target, args, val) in calls.items():
        node = graph.call_function(target, args)
        node.meta["val"] = val
        nodes[name] = node
    wait = graph.call_function(c10d.wait_tensor.default, (nodes["all_reduce"],))
    wait.meta["val"] = torch.empty(256, 1024)
    nodes["wait"] = wait
    graph.output((wait,))
    return graph, nodes


def test_collectives_and_their_waits_are_banned_other_ops_are_not():
    _, nodes = _collective_graph()
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "wait"):
        assert collective(nodes[name], None) == COLLECTIVE_REASON  # type: ignore[arg-type]
        assert never_released(nodes[name], MinCutOptions()) == COLLECTIVE_REASON
    assert collective(nodes["relu"], None) is None  # type: ignore[arg-type]
    assert never_released(nodes["relu"], MinCutOptions()) is None


def test_allow_recompute_collectives_turns_the_rule_off():
    assert "collective" in dict(active_ban_rules(PartitionConfig.from_flags().options))
    with functorch_config.patch(allow_recompute_collectives=True):
        options = PartitionConfig.from_flags().options
    assert options.ban_if_collective is False
    assert "collective" not in dict(active_ban_rules(options))
    _, nodes = _collective_graph()
    assert never_released(nodes["all_reduce"], options) is None


def test_collectives_are_priced_by_wire_bytes_over_the_bandwidth():
    _, nodes = _collective_graph()
    mib = 1024 * 1024
    assert wire_bytes(nodes["all_reduce"]) == 2 * mib          # ring: the payload twice
    assert wire_bytes(nodes["all_gather"]) == 3 * mib          # 3/4 of the 4 MiB gathered
    assert wire_bytes(nodes["reduce_scatter"]) == 0.75 * mib   # 3/4 of the input
    assert wire_bytes(nodes["broadcast"]) == mib
    assert wire_bytes(nodes["wait"]) == 0 and wire_bytes(nodes["relu"]) == 0
    assert collective_seconds(nodes["all_reduce"], 50.0) == pytest.approx(2 * mib / 50e9)
    with pytest.raises(ValueError, match=r"collective bandwidth must be a positive number of "
                                         r"GB/s, got 0.0 \(flag collective_bandwidth_gbps\)"):
        collective_seconds(nodes["all_reduce"], 0.0)


def test_the_profile_estimator_never_runs_a_collective(monkeypatch):
    _, nodes = _collective_graph()

    def must_not_run(node: fx.Node) -> float:
        raise AssertionError(f"profiled {node.name}")

    monkeypatch.setitem(estimators._MEASURES, "profile", must_not_run)
    estimators.clear_runtime_cache()
    mib = 1024 * 1024
    assert estimators.estimate_runtime(nodes["all_reduce"], "profile") == pytest.approx(
        2 * mib / 50e9 * 1e3)  # ms
    assert estimators.estimate_runtime(nodes["all_reduce"], "roofline") == pytest.approx(
        2 * mib / 50e9)        # s
    assert estimators.estimate_runtime(nodes["wait"], "profile") == 0.0
    with functorch_config.patch(collective_bandwidth_gbps=12.5):
        assert estimators.estimate_runtime(nodes["all_reduce"], "profile") == pytest.approx(
            2 * mib / 12.5e9 * 1e3)
    with pytest.raises(AssertionError, match="profiled relu"):  # the opposite case
        estimators.estimate_runtime(nodes["relu"], "profile")


def test_collective_bandwidth_must_be_positive_and_finite():
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match=r"collective_bandwidth_gbps = .* is not valid: "
                                             r"must be a positive, finite number of GB/s"):
            functorch_config.collective_bandwidth_gbps = bad
    assert functorch_config.collective_bandwidth_gbps == 50.0


def test_one_rank_has_no_agreement_and_keeps_wall_clock_limits():
    graph, _ = _collective_graph()
    assert not spmd.multi_rank()
    with spmd.rank_agreement(graph, PartitionConfig(runtime_estimator="profile"),
                             needs_runtimes=True, measure=operator.not_,
                             signature=estimators.profile_key):
        assert spmd.current() is None
        assert not spmd.deterministic_limits()
        assert milp_limits(10.0, deterministic=spmd.deterministic_limits()) == {"time_limit": 10.0}
    spmd.check_saved_agreement([], PartitionConfig(check_agreement=True))  # nothing to check


def test_under_an_agreement_milp_limits_are_nodes_and_profiles_are_the_agreed_ones():
    _, nodes = _collective_graph()
    key = estimators.profile_key(nodes["relu"])
    token = spmd._CURRENT.set(spmd.Agreement({key: 7.0}, deterministic_limits=True))
    try:
        assert spmd.deterministic_limits()
        assert milp_limits(10.0, deterministic=True) == {"node_limit": 10 * MILP_NODES_PER_SECOND}
        assert milp_limits(2.0, deterministic=True) == {"node_limit": 2 * MILP_NODES_PER_SECOND}
        assert milp_limits(float("inf"), deterministic=True) == {}
        assert estimators.estimate_runtime(nodes["relu"], "profile") == 7.0
        # an op that was not agreed gets its roofline time (ms), never a local measurement
        graph = fx.Graph()
        x = graph.placeholder("y")
        x.meta["val"] = torch.empty(8, 8)
        other = graph.call_function(torch.ops.aten.sin.default, (x,))
        other.meta["val"] = torch.empty(8, 8)
        assert estimators.estimate_runtime(other, "profile") == pytest.approx(
            estimators.roofline_runtime(other) * 1e3)
    finally:
        spmd._CURRENT.reset(token)


def test_a_node_limit_stop_counts_as_not_proven_optimal():
    # scipy (1.17) reports HiGHS's node limit as status 4 with this message
    node_limit = ("The HiGHS status code was not recognized. (HiGHS Status 16: Solution limit "
                  "reached)")
    assert stopped_by_limit(4, node_limit)
    assert stopped_by_limit(1, "Time limit reached. (HiGHS Status 13: Time limit reached)")
    assert not stopped_by_limit(0, "Optimization terminated successfully. (HiGHS Status 7: "
                                        "Optimal)")
    assert not stopped_by_limit(4, "The problem is unbounded or infeasible. ")


def test_the_disagreement_message_names_the_nodes_of_each_rank():
    message = spmd._describe_disagreement([["a", "b"], ["a", "b"], ["a", "c"]], rank=2)
    assert message == (
        "the ranks' partitions differ (check_partition_agreement, seen on rank 2): rank 0 saves "
        "['b'] that rank 2 does not; rank 2 saves ['c'] that rank 0 does not. Every rank must "
        "decide the same; with the 'profile' estimator keep agree_partition_across_ranks on")


# ---- 2 real ranks: functional collectives and measured runtimes -------------------------------

@pytest.fixture(scope="module")
def decisions():
    return run_ranks("dist_cases_spmd:decisions", world_size=2, timeout=240)


def test_no_collective_is_recomputed_at_any_budget_with_either_solver(decisions):
    for rank in decisions:
        for case, seen in rank["collectives"]["ours"].items():
            assert seen["recomputed"] == [], (case, seen)
            assert seen["grads_match"], case
    assert decisions[0]["collectives"]["ours"] == decisions[1]["collectives"]["ours"]


def test_the_report_says_why_a_collective_is_saved(decisions):
    assert decisions[0]["collectives"]["collective_reasons"] == [COLLECTIVE_REASON]


def test_torch_and_the_allow_flag_recompute_all_six_at_budget_zero(decisions):
    # The opposite case: the same block does recompute its collectives without the rule.
    for rank in decisions:
        assert rank["collectives"]["torch 0.0"] == BLOCK_COLLECTIVES
        assert rank["collectives"]["ours allowed 0.0"] == BLOCK_COLLECTIVES


def test_rank_dependent_measurements_still_give_one_decision(decisions):
    first, second = (rank["profiles"] for rank in decisions)
    assert first["agreed"] == second["agreed"]
    # without the agreement step the same measurements split the ranks (the test can fail)
    assert first["not agreed"] != second["not agreed"]


def test_the_agreement_check_names_the_differing_nodes(decisions):
    first, second = (set(rank["profiles"]["not agreed"]) for rank in decisions)
    for rank, seen in enumerate(decisions):
        assert seen["profiles"]["check, not agreed"] == (
            f"the ranks' partitions differ (check_partition_agreement, seen on rank {rank}): "
            f"rank 0 saves {sorted(first - second)} that rank 1 does not; rank 1 saves "
            f"{sorted(second - first)} that rank 0 does not. Every rank must decide the same; "
            "with the 'profile' estimator keep agree_partition_across_ranks on")


def test_the_agreement_check_is_quiet_when_ranks_agree(decisions):
    assert [rank["profiles"]["check, agreed"] for rank in decisions] == [None, None]


def test_ranks_compiling_different_graphs_fail_alike_instead_of_hanging(decisions):
    # rank 1's blocks are half as wide: other op signatures, as many of them
    for seen in decisions:
        match = re.fullmatch(
            r"ranks compile different graphs: the ranks' joint graphs have \d+ distinct op "
            r"signatures to profile each, but not the same ones; the 'profile' estimator's times "
            r"cannot be agreed. Ranks that compile different graphs \(pipeline stages\) need "
            r"the flag agree_partition_across_ranks=False",
            seen["profiles"]["different graphs"])
        assert match, seen["profiles"]["different graphs"]


# ---- 2 real ranks: DDP and FSDP2 through torch.compile(backend="aot_pipeline") ---------------

# AOTAutograd graphs per variant: Dynamo's DDP optimizer splits the model at its (tiny)
# buckets; FSDP2 compiles each block; the python reducer of compiled autograd splits nothing.
GRAPHS = {"ddp": 5, "fsdp2": 2, "ddp+compiled_autograd": 1}


def test_ddp_and_fsdp2_give_eager_gradients_at_every_budget():
    # Each rank feeds its own batch, so the gradients match eager's only when averaged.
    variants = [{"wrap": wrap, "budget": budget, "compiler": "nop"}
                for wrap in ("ddp", "fsdp2") for budget in (1.0, 0.5, 0.0)]
    variants += [{"wrap": "fsdp2", "budget": 0.5, "compiler": "inductor"},
                 {"wrap": "ddp+compiled_autograd", "budget": 0.5, "compiler": "nop"},
                 # the agreement of measured times and the check, inside torch.compile
                 {"wrap": "fsdp2", "budget": 0.5, "compiler": "nop",
                  "flags": {"activation_memory_budget_runtime_estimator": "profile",
                            "check_partition_agreement": True}}]
    results = run_ranks("dist_cases_spmd:training", world_size=2, kwargs={"variants": variants},
                        timeout=300)
    for rank in results:
        assert [(seen["wrap"], seen["budget"], seen["compiler"]) for seen in rank] == [
            (v["wrap"], v["budget"], v["compiler"]) for v in variants]
        for seen in rank:
            assert seen["max_grad_error"] <= 1e-5, seen
            assert seen["graphs"] == GRAPHS[seen["wrap"]], seen
            # one agreement of 'profile' times per compiled graph, none with the default estimator
            profiled = "flags" in seen
            assert seen["profile agreements"] == (seen["graphs"] if profiled else 0), seen


# ---- 2 real ranks: back-to-back collectives while torch compiles (a deadlock before) ----------

# Judged by state, not by the clock: a run that still counts rounds is not deadlocked however
# slow the machine; one whose counts stand still for STALL_S while both ranks are in the loop
# is. Starting the ranks (torch's import) is outside every bound (ranks.py).
STALL_S = 20


def test_back_to_back_agreements_under_the_python_dispatcher_finish():
    # 1,000 rounds of 3 all-reduces: without the fix torch 2.13 deadlocked within 10-200
    assert run_ranks("dist_cases_spmd:back_to_back_agreements", world_size=2,
                     kwargs={"rounds": 1000}, ready="marked", stall_timeout=STALL_S,
                     timeout=500) == [1000, 1000]


def test_the_same_collectives_with_the_python_dispatcher_on_deadlock():
    # The opposite case: what the fix guards against. Both ranks end up in an all-reduce, one
    # queueing it with the GIL held, the other waiting for it: their round counts stop.
    with pytest.raises(RanksFailed, match=f"made no progress in {STALL_S} s") as failure:
        run_ranks("dist_cases_spmd:back_to_back_agreements", world_size=2,
                  kwargs={"rounds": 100_000, "guarded": False}, ready="marked",
                  stall_timeout=STALL_S, timeout=500)
    counts = re.search(r"count stayed at \[(\d+), (\d+)\]", str(failure.value))
    assert counts is not None and max(map(int, counts.groups())) < 100_000, str(failure.value)
    for rank_output in str(failure.value).split("--- rank ")[1:]:
        assert re.search(r"distributed_c10d.py\", line \d+ in all_reduce\n.*\n.*"
                         r"line \d+ in _all_reduce_max", rank_output), rank_output


# ---- 2 real ranks: a cache warm on one rank only -------------------------------------------

# Partitioning runs collectives under the first two (the agreement of 'profile' times, the
# saved-set check), none under the third (the defaults).
CACHE_FLAG_SETS = {"profile times": {"activation_memory_budget_runtime_estimator": "profile"},
                   "agreement check": {"check_partition_agreement": True},
                   "no collectives": {}}


@pytest.fixture(scope="module")
def caches_warm_on_one_rank():
    """Per flag set, both ranks' answers (one start of the ranks for all three)."""
    ranks = run_ranks("dist_cases_spmd:caches_warm_on_one_rank", world_size=2,
                      kwargs={"flag_sets": list(CACHE_FLAG_SETS.values())}, timeout=300)
    return {name: [rank[i] for rank in ranks] for i, name in enumerate(CACHE_FLAG_SETS)}


@pytest.mark.parametrize("flags", ["profile times", "agreement check"])
def test_a_cache_warm_on_one_rank_only_does_not_leave_the_others_waiting(
        caches_warm_on_one_rank, flags):
    # A rank whose AOTAutograd cache hits would skip partitioning, and its collectives, and
    # leave the others waiting in them (before the fix: rank 1 waited in the agreement's
    # all-reduce until rank 0 exited). So that cache is off on every rank.
    for seen in caches_warm_on_one_rank[flags]:
        assert seen["max_grad_error"] <= 1e-5, seen
        for compile_ in ("first", "second"):
            assert not any(key in seen[compile_] for key in (
                "autograd_cache_hit", "autograd_cache_miss", "autograd_cache_saved")), seen


def test_without_collectives_a_cache_warm_on_one_rank_is_used(caches_warm_on_one_rank):
    # The opposite case: the default estimator, no check: partitioning runs no collective, the
    # cache stays on, and rank 0's second compile is a hit where rank 1's is not.
    rank0, rank1 = caches_warm_on_one_rank["no collectives"]
    for seen in (rank0, rank1):
        assert seen["max_grad_error"] <= 1e-5, seen
        assert seen["first"].get("autograd_cache_miss") == 1, seen
    assert rank0["second"].get("autograd_cache_hit") == 1, rank0
    assert rank1["second"].get("autograd_cache_miss") == 1, rank1
