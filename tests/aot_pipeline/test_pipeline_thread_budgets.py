"""Two threads partitioning at different memory budgets each get their own budget (issue #14).

The pipeline's partition function patches ``aot_config.functorch.activation_memory_budget``
around aot_partition's min-cut partitioner. Patches are per thread, so a thread partitioning at
budget 0.0 never sees another thread's 1.0, however the two interleave.
"""

from __future__ import annotations

import copy
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest
import torch
from aot_config import functorch as functorch_flags
from aot_pipeline.backend import make_partition_fn
from aot_pipeline.joint import JointGraph, trace_joint
from aot_pipeline.options import PipelineOptions
from torch import nn

CALLS_PER_THREAD = 60
BUDGETS = (0.0, 1.0)


@pytest.fixture(scope="module")
def joint() -> JointGraph:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Sigmoid(), nn.Linear(16, 4)
    )
    return trace_joint(model, [torch.randn(4, 8, requires_grad=True)])


@pytest.fixture
def fast_thread_switches() -> Iterator[None]:
    """Switch threads every few bytecodes so the two partition loops really interleave."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def saved_for_backward(joint: JointGraph, budget: float) -> tuple[str, ...]:
    """What the forward graph saves for the backward when partitioned at ``budget``."""
    partition = make_partition_fn(PipelineOptions(memory_budget=budget))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's pytree, inside deepcopy
        module = copy.deepcopy(joint.module)
    forward, _ = partition(module, joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    output = next(node for node in forward.graph.nodes if node.op == "output")
    return tuple(str(getattr(value, "name", value)) for value in output.args[0])


def test_two_threads_partition_at_their_own_budgets(joint, fast_thread_switches) -> None:
    expected = {budget: saved_for_backward(joint, budget) for budget in BUDGETS}
    # The test can only catch a leaked budget if the budget changes the decision.
    assert expected[0.0] != expected[1.0]

    results: dict[float, list[tuple[str, ...]]] = {budget: [] for budget in BUDGETS}
    errors: list[BaseException] = []
    start = threading.Barrier(len(BUDGETS))

    def work(budget: float) -> None:
        try:
            start.wait()
            for _ in range(CALLS_PER_THREAD):
                results[budget].append(saved_for_backward(joint, budget))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(budget,)) for budget in BUDGETS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    for budget in BUDGETS:
        assert len(results[budget]) == CALLS_PER_THREAD
        wrong = [saved for saved in results[budget] if saved != expected[budget]]
        assert not wrong, f"{len(wrong)} partitions at budget {budget} used another budget"
    # Nothing leaked into this thread or the process-wide value.
    assert functorch_flags.activation_memory_budget == 1.0
    assert functorch_flags.value_source("activation_memory_budget") == "default"
    assert functorch_flags.patched_flags() == {}


def test_an_unpatched_thread_sees_the_process_wide_budget() -> None:
    """A plain assignment is process-wide: a thread that has not patched the flag sees it,
    while the patching thread keeps its patch."""
    seen: list[float] = []
    functorch_flags.activation_memory_budget = 0.25
    try:
        with functorch_flags.patch(activation_memory_budget=0.75):
            thread = threading.Thread(
                target=lambda: seen.append(functorch_flags.activation_memory_budget)
            )
            thread.start()
            thread.join()
            assert functorch_flags.activation_memory_budget == 0.75
    finally:
        functorch_flags.reset("activation_memory_budget")
    assert seen == [0.25]
