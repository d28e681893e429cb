"""patch(): context manager, decorator, TestCase decorator, nesting, restore on exceptions."""

from __future__ import annotations

import asyncio
import unittest

import pytest
from aot_config import dynamo, functorch


def test_context_manager_applies_and_restores() -> None:
    with functorch.patch(activation_memory_budget=0.5, cse=False):
        assert functorch.activation_memory_budget == 0.5
        assert functorch.cse is False
    assert functorch.activation_memory_budget == 1.0
    assert functorch.cse is True
    assert functorch.is_default("activation_memory_budget")


def test_positional_and_dict_forms() -> None:
    with functorch.patch("min_cut_solver", "networkx"):
        assert functorch.min_cut_solver == "networkx"
    with functorch.patch({"min_cut_solver": "networkx"}, cse=False):
        assert (functorch.min_cut_solver, functorch.cse) == ("networkx", False)
    assert functorch.min_cut_solver == "scipy"


def test_restores_on_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with functorch.patch(activation_memory_budget=0.25):
            assert functorch.activation_memory_budget == 0.25
            raise RuntimeError("boom")
    assert functorch.activation_memory_budget == 1.0


def test_restores_a_previously_set_value() -> None:
    functorch.max_dist_from_bw = 7
    with functorch.patch(max_dist_from_bw=3):
        assert functorch.max_dist_from_bw == 3
    assert functorch.max_dist_from_bw == 7


def test_nested_patches_unwind_in_order() -> None:
    with functorch.patch(activation_memory_budget=0.8):
        with functorch.patch(activation_memory_budget=0.4, cse=False):
            assert functorch.activation_memory_budget == 0.4
            with functorch.patch(cse=True):
                assert functorch.cse is True
            assert functorch.cse is False
        assert functorch.activation_memory_budget == 0.8
        assert functorch.cse is True
    assert functorch.activation_memory_budget == 1.0


def test_same_patch_object_can_be_reentered() -> None:
    patch = functorch.patch(max_dist_from_bw=5)
    with patch:
        functorch.max_dist_from_bw = 6
        with patch:
            assert functorch.max_dist_from_bw == 5
        assert functorch.max_dist_from_bw == 6
    assert functorch.max_dist_from_bw == 1000


def test_function_decorator_patches_each_call() -> None:
    @functorch.patch(activation_memory_budget_solver="greedy")
    def solver() -> str:
        return functorch.activation_memory_budget_solver

    assert solver() == "greedy"
    assert functorch.activation_memory_budget_solver == "dp"
    assert solver.__name__ == "solver"


def test_function_decorator_restores_on_exception() -> None:
    @dynamo.patch(compiled_autograd=True)
    def failing() -> None:
        assert dynamo.compiled_autograd is True
        raise KeyError("inner")

    with pytest.raises(KeyError, match="inner"):
        failing()
    assert dynamo.compiled_autograd is False


def test_async_function_decorator() -> None:
    @functorch.patch(cse=False)
    async def read() -> bool:
        return functorch.cse

    assert asyncio.run(read()) is False
    assert functorch.cse is True


def test_testcase_class_decorator() -> None:
    seen: list[object] = []

    @functorch.patch(activation_memory_budget=0.3)
    class BudgetTests(unittest.TestCase):
        def setUp(self) -> None:
            seen.append(("setUp", functorch.activation_memory_budget))

        def test_one(self) -> None:
            seen.append(functorch.activation_memory_budget)

        def test_two_fails(self) -> None:
            raise AssertionError("deliberate")

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(BudgetTests).run(result)
    assert result.testsRun == 2
    assert len(result.failures) == 1
    assert seen.count(("setUp", 0.3)) == 2
    assert 0.3 in seen
    assert functorch.activation_memory_budget == 1.0


def test_decorating_a_plain_class_is_refused() -> None:
    with pytest.raises(TypeError, match="functions and unittest.TestCase classes, not Plain"):

        @functorch.patch(cse=False)
        class Plain:
            pass


def test_bad_patches_fail_eagerly() -> None:
    with pytest.raises(AttributeError, match="no flag 'csee'; did you mean 'cse'"):
        functorch.patch(csee=False)
    with pytest.raises(ValueError, match=r"functorch\.cse = 'no' is not valid"):
        functorch.patch("cse", "no")
    with pytest.raises(TypeError, match=r"patch\('cse'\) needs a value"):
        functorch.patch("cse")
    with pytest.raises(
        TypeError, match="expects a flag name, a dict or keyword arguments, got int"
    ):
        functorch.patch(3)
    assert functorch.cse is True


def test_decorating_a_generator_function_is_refused() -> None:
    with pytest.raises(TypeError, match=r"cannot decorate the generator function '.*numbers'"):

        @functorch.patch(cse=False)
        def numbers():
            yield functorch.cse


def test_bad_names_and_arguments_name_the_culprit() -> None:
    with pytest.raises(TypeError, match=r"a flag name must be a str, got 3"):
        functorch.patch({3: True})
    with pytest.raises(TypeError, match=r"patch\(dict\) takes no second positional argument"):
        functorch.patch({"cse": False}, True)
    with pytest.raises(TypeError, match="cannot decorate 3: expected a function"):
        functorch.patch(cse=False)(3)
    with pytest.raises(AttributeError, match="no flag 'csee'; did you mean 'cse'"):
        functorch._make_closure_patcher(csee=False)
