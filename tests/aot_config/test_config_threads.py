"""Patches are per thread, nest in any exit order and restore exactly (issue #14).

Also: unittest.mock / monkeypatch restore outer values, the derived views (hash, dicts, codegen,
save) see the thread's effective values, and the closure patcher follows the same rules.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import sys
import threading
import unittest
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from unittest import mock

import pytest
from aot_config import Flag, dynamo, functorch


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a fresh thread and return its result (re-raising its exception)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result(timeout=60)


@pytest.fixture
def fast_thread_switches() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


# ---- per thread -------------------------------------------------------------------------------


def test_a_patch_is_invisible_to_other_threads() -> None:
    entered, checked = threading.Event(), threading.Event()
    seen: list[float] = []

    def patched_thread() -> None:
        with functorch.patch(activation_memory_budget=0.3):
            entered.set()
            checked.wait(10)
            seen.append(functorch.activation_memory_budget)

    thread = threading.Thread(target=patched_thread)
    thread.start()
    entered.wait(10)
    assert functorch.activation_memory_budget == 1.0
    assert functorch.value_source("activation_memory_budget") == "default"
    checked.set()
    thread.join()
    assert seen == [0.3]


def test_issue_scenario_threads_exit_in_the_other_order() -> None:
    """a = patch(0.3), b = patch(0.7); a enters, b enters, a exits, b exits: nothing leaks."""
    a = functorch.patch(activation_memory_budget=0.3)
    b = functorch.patch(activation_memory_budget=0.7)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, list[float]] = {"a": [], "b": []}

    def first() -> None:
        with a:
            a_in.set()
            b_in.wait(10)
            seen["a"].append(functorch.activation_memory_budget)
        a_out.set()
        seen["a"].append(functorch.activation_memory_budget)

    def second() -> None:
        a_in.wait(10)
        with b:
            b_in.set()
            a_out.wait(10)
            seen["b"].append(functorch.activation_memory_budget)
        seen["b"].append(functorch.activation_memory_budget)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"a": [0.3, 1.0], "b": [0.7, 1.0]}
    assert functorch.activation_memory_budget == 1.0
    assert functorch.value_source("activation_memory_budget") == "default"


def test_unpatched_threads_see_plain_assignments() -> None:
    functorch.cse = False
    assert in_thread(lambda: functorch.cse) is False
    in_thread(lambda: setattr(functorch, "max_dist_from_bw", 7))
    assert functorch.max_dist_from_bw == 7
    assert functorch.value_source("max_dist_from_bw") == "set"


def test_a_patched_thread_keeps_its_value_over_a_global_write() -> None:
    with functorch.patch(max_dist_from_bw=3):
        in_thread(lambda: setattr(functorch, "max_dist_from_bw", 9))
        assert functorch.max_dist_from_bw == 3
        assert functorch.value_source("max_dist_from_bw") == "patched"
    assert functorch.max_dist_from_bw == 9


def test_assignment_inside_a_patch_lasts_until_that_patch_exits() -> None:
    with functorch.patch(max_dist_from_bw=3):
        functorch.max_dist_from_bw = 4  # the flag is patched here: the write goes to the patch
        functorch.cse = False  # not patched: a process-wide write
        assert functorch.max_dist_from_bw == 4
        assert in_thread(lambda: (functorch.max_dist_from_bw, functorch.cse)) == (1000, False)
    assert functorch.max_dist_from_bw == 1000
    assert functorch.cse is False


def test_exiting_in_another_thread_is_refused_and_leaves_the_patch_active() -> None:
    patch = functorch.patch(cse=False)
    patch.__enter__()
    try:
        with pytest.raises(RuntimeError, match="not active in this thread"):
            in_thread(lambda: patch.__exit__(None, None, None))
        assert functorch.cse is False
    finally:
        patch.__exit__(None, None, None)
    assert functorch.cse is True
    with pytest.raises(RuntimeError, match="not active in this thread"):
        patch.__exit__(None, None, None)


# ---- exit order within one thread -------------------------------------------------------------


def test_same_thread_out_of_order_exit_removes_only_the_exiting_layer() -> None:
    functorch.activation_memory_budget = 0.9
    a = functorch.patch(activation_memory_budget=0.3)
    b = functorch.patch(activation_memory_budget=0.7, cse=False)
    a.__enter__()
    b.__enter__()
    assert functorch.activation_memory_budget == 0.7
    a.__exit__(None, None, None)
    assert (functorch.activation_memory_budget, functorch.cse) == (0.7, False)
    b.__exit__(None, None, None)
    assert (functorch.activation_memory_budget, functorch.cse) == (0.9, True)
    assert functorch.patched_flags() == {}
    assert functorch.value_source("cse") == "default"


def test_same_thread_out_of_order_exit_uncovers_the_older_patch() -> None:
    a = functorch.patch(activation_memory_budget=0.3)
    b = functorch.patch(activation_memory_budget=0.7)
    a.__enter__()
    b.__enter__()
    b_inner = functorch.patch(cse=False)
    b_inner.__enter__()
    b.__exit__(None, None, None)  # not the innermost: only b's layer goes
    assert (functorch.activation_memory_budget, functorch.cse) == (0.3, False)
    a.__exit__(None, None, None)
    b_inner.__exit__(None, None, None)
    assert (functorch.activation_memory_budget, functorch.cse) == (1.0, True)
    assert functorch.is_default("activation_memory_budget")


# ---- stress -----------------------------------------------------------------------------------

STRESS_FLAGS = {
    "activation_memory_budget": [0.0, 0.1, 0.25, 0.5, 0.75],
    "max_dist_from_bw": [1, 2, 3, 5, 8],
    "activation_memory_budget_solver": ["greedy", "ilp", "dp_graph"],
}


def test_stress_8_threads_2000_patches_interleaved_exits(fast_thread_switches) -> None:
    functorch.max_dist_from_bw = 42  # a process-wide value under all the patches
    baseline = functorch.to_dict()
    threads, patches_per_thread = 8, 2000
    errors: list[str] = []
    start = threading.Barrier(threads + 1)

    def expected(open_patches: list[tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
        view = {name: baseline[name] for name in STRESS_FLAGS}
        for _, changes in open_patches:
            view.update(changes)
        return view

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        open_patches: list[tuple[Any, dict[str, Any]]] = []
        start.wait()
        entered = 0
        try:
            while entered < patches_per_thread or open_patches:
                room = len(open_patches) < 6 and rng.random() < 0.6
                if entered < patches_per_thread and (not open_patches or room):
                    names = rng.sample(sorted(STRESS_FLAGS), rng.randint(1, 2))
                    changes = {name: rng.choice(STRESS_FLAGS[name]) for name in names}
                    patch = functorch.patch(changes)
                    patch.__enter__()
                    open_patches.append((patch, changes))
                    entered += 1
                else:
                    patch, _ = open_patches.pop(rng.randrange(len(open_patches)))
                    patch.__exit__(None, None, None)
                view = {name: getattr(functorch, name) for name in STRESS_FLAGS}
                if view != expected(open_patches):
                    errors.append(f"thread {seed}: {view} != {expected(open_patches)}")
                    return
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(f"thread {seed}: {error!r}")

    def unpatched_reader(stop: threading.Event) -> None:
        start.wait()
        while not stop.is_set():
            if functorch.to_dict() != baseline:
                errors.append("an unpatched thread saw a patch")
                return

    stop = threading.Event()
    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
    reader = threading.Thread(target=unpatched_reader, args=(stop,))
    for thread in [*workers, reader]:
        thread.start()
    for thread in workers:
        thread.join(120)
    stop.set()
    reader.join(10)
    assert errors == []
    assert functorch.to_dict() == baseline
    assert functorch.patched_flags() == {}


# ---- unittest.mock and monkeypatch ------------------------------------------------------------


def test_nested_mock_patch_object_restores_the_outer_value() -> None:
    with mock.patch.object(functorch, "cse", False):
        with mock.patch.object(functorch, "cse", True):
            assert functorch.cse is True
        assert functorch.cse is False
    assert functorch.cse is True
    assert functorch.is_default("cse")


def test_nested_mock_patch_matches_torch() -> None:
    torch_config = pytest.importorskip("torch._functorch.config")
    seen = {}
    for name, config in (("torch", torch_config), ("ours", functorch)):
        with mock.patch.object(config, "activation_memory_budget", 0.5):
            with mock.patch.object(config, "activation_memory_budget", 0.25):
                inner = config.activation_memory_budget
            middle = config.activation_memory_budget
        seen[name] = (inner, middle, config.activation_memory_budget)
    assert seen["ours"] == seen["torch"] == (0.25, 0.5, 1.0)


def test_mock_patch_inside_a_config_patch_stays_in_the_patch() -> None:
    with functorch.patch(max_dist_from_bw=3):
        with mock.patch.object(functorch, "max_dist_from_bw", 4):
            assert functorch.max_dist_from_bw == 4
            assert in_thread(lambda: functorch.max_dist_from_bw) == 1000
        assert functorch.max_dist_from_bw == 3
    assert functorch.max_dist_from_bw == 1000


def test_mock_patch_dict_style_decorator_restores() -> None:
    @mock.patch.object(dynamo, "compiled_autograd", True)
    def read() -> bool:
        return dynamo.compiled_autograd

    assert read() is True
    assert dynamo.compiled_autograd is False


def test_monkeypatch_setattr_and_delattr_restore(monkeypatch) -> None:
    functorch.cse = False
    monkeypatch.setattr(functorch, "cse", True)
    monkeypatch.setattr(functorch, "cse", True)
    assert functorch.cse is True
    monkeypatch.delattr(functorch, "max_dist_from_bw")
    assert not hasattr(functorch, "max_dist_from_bw")
    assert in_thread(lambda: functorch.max_dist_from_bw) == 1000  # del hides in this thread only
    monkeypatch.undo()
    assert functorch.cse is False
    assert functorch.max_dist_from_bw == 1000


# ---- everything reads the thread's effective values -------------------------------------------


def test_derived_views_see_the_threads_patches() -> None:
    def views() -> tuple[Any, ...]:
        return (
            functorch.get_hash(),
            functorch.to_dict()["activation_memory_budget"],
            functorch.get_config_copy()["activation_memory_budget"],
            "activation_memory_budget = 0.5" in functorch.codegen_config(),
            functorch.save_config(),
            functorch.save_config_portable()["activation_memory_budget"],
            functorch.is_default("activation_memory_budget"),
            functorch.value_source("activation_memory_budget"),
        )

    unpatched = views()
    with functorch.patch(activation_memory_budget=0.5):
        patched = views()
        assert in_thread(views) == unpatched
    assert patched[1:4] == (0.5, 0.5, True)
    assert patched[5:] == (0.5, False, "patched")
    assert patched[0] != unpatched[0] and patched[4] != unpatched[4]
    functorch.activation_memory_budget = 0.5
    assert functorch.get_hash() == patched[0]
    assert in_thread(functorch.get_hash) == patched[0]


def test_environment_forced_flag_wins_over_patches(make_config) -> None:
    config = make_config(
        environ={"FORCE_BUDGET": "0.2"}, budget=Flag(1.0, env_forces="FORCE_BUDGET")
    )
    with pytest.warns(UserWarning, match="forced to 0.2"):
        with config.patch(budget=0.6):
            assert config.budget == 0.2
            assert config.value_source("budget") == "forced by FORCE_BUDGET"
    assert in_thread(lambda: config.budget) == 0.2


def test_environment_default_is_what_unpatched_threads_see(make_config) -> None:
    config = make_config(environ={"MY_BUDGET": "0.4"}, budget=Flag(1.0, env="MY_BUDGET"))
    with config.patch(budget=0.6):
        assert config.budget == 0.6
        assert in_thread(lambda: (config.budget, config.value_source("budget"))) == (
            0.4,
            "env MY_BUDGET",
        )
    assert config.is_default("budget")


def test_decorated_function_runs_patched_in_each_thread_independently() -> None:
    barrier = threading.Barrier(2)

    @functorch.patch(activation_memory_budget_solver="greedy")
    def greedy() -> str:
        barrier.wait(10)
        return functorch.activation_memory_budget_solver

    def plain() -> str:
        barrier.wait(10)
        return functorch.activation_memory_budget_solver

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [pool.submit(greedy), pool.submit(plain)]
        assert [r.result(timeout=10) for r in results] == ["greedy", "dp"]


def test_testcase_decorator_patches_tests_run_in_a_thread() -> None:
    seen: list[float] = []

    @functorch.patch(activation_memory_budget=0.3)
    class Budget(unittest.TestCase):
        def test_budget(self) -> None:
            seen.append(functorch.activation_memory_budget)
            seen.append(in_thread(lambda: functorch.activation_memory_budget))

    def run() -> unittest.TestResult:
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Budget).run(result)
        return result

    assert in_thread(run).wasSuccessful()
    assert seen == [0.3, 1.0]
    assert functorch.activation_memory_budget == 1.0


def test_copy_context_carries_patches_into_a_worker() -> None:
    with functorch.patch(cse=False):
        context = contextvars.copy_context()
        assert in_thread(lambda: functorch.cse) is True
        assert in_thread(lambda: context.run(lambda: functorch.cse)) is False


def test_asyncio_tasks_keep_their_own_patches() -> None:
    async def task(value: float, gate: asyncio.Event, other: asyncio.Event) -> list[float]:
        with functorch.patch(activation_memory_budget=value):
            gate.set()
            await other.wait()
            await asyncio.sleep(0)
            return [functorch.activation_memory_budget]

    async def main() -> list[list[float]]:
        first, second = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(task(0.1, first, second), task(0.9, second, first))

    assert asyncio.run(main()) == [[0.1], [0.9]]
    assert functorch.activation_memory_budget == 1.0


def test_closure_patcher_is_per_thread_and_reverts_exactly() -> None:
    change = functorch._make_closure_patcher(cse=False, activation_memory_budget=0.5)
    revert_outer = change()
    revert_inner = functorch._make_closure_patcher(activation_memory_budget=0.25)()
    assert (functorch.cse, functorch.activation_memory_budget) == (False, 0.25)
    assert in_thread(lambda: functorch.cse) is True
    revert_outer()  # out of order: only its own layer goes
    assert (functorch.cse, functorch.activation_memory_budget) == (True, 0.25)
    revert_inner()
    revert_inner()  # a second revert does nothing
    assert functorch.patched_flags() == {}
    with pytest.raises(ValueError, match="activation_memory_budget = 2 is not valid"):
        functorch._make_closure_patcher(activation_memory_budget=2)


def test_patched_mutable_values_are_private_to_each_entry() -> None:
    patch = dynamo.patch(allowed_functions_module_string_ignorelist={"a"})
    with patch:
        dynamo.allowed_functions_module_string_ignorelist.add("b")
    with patch:
        assert dynamo.allowed_functions_module_string_ignorelist == {"a"}
    assert patch.changes["allowed_functions_module_string_ignorelist"] == {"a"}


def test_load_config_inside_a_patch_writes_like_assignment() -> None:
    with functorch.patch(cse=True):
        functorch.load_config({"cse": False, "max_dist_from_bw": 5})
        assert (functorch.cse, functorch.max_dist_from_bw) == (False, 5)
        assert in_thread(lambda: (functorch.cse, functorch.max_dist_from_bw)) == (True, 5)
    assert functorch.cse is True  # the patched flag was written into the patch
    assert functorch.max_dist_from_bw == 5  # the other one process-wide
