from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from aot_compilers import is_boxed, make_boxed_compiler, make_boxed_func


def add(x, y):
    return x + y


def test_boxed_func_takes_one_list_and_is_marked():
    boxed = make_boxed_func(add)
    assert is_boxed(boxed) and not is_boxed(add)
    assert boxed([2, 3]) == 5
    assert boxed.__name__ == "add"


def test_boxed_func_rejects_unboxed_call_with_clear_message():
    with pytest.raises(TypeError, match=r"takes ONE list of arguments, got int"):
        make_boxed_func(add)(2)


def test_boxing_twice_returns_the_same_function():
    boxed = make_boxed_func(add)
    assert make_boxed_func(boxed) is boxed


def test_boxed_compiler_returns_boxed_callable_running_the_graph():
    gm = fx.symbolic_trace(lambda x: torch.sin(x) * 2)
    seen = []

    def compiler(graph, example_inputs):
        seen.append(len(example_inputs))
        return graph

    boxed = make_boxed_compiler(compiler)(gm, [torch.ones(3)])
    assert seen == [1] and is_boxed(boxed)
    x = torch.randn(3)
    torch.testing.assert_close(boxed([x]), torch.sin(x) * 2)


def test_non_callables_are_refused_by_name():
    with pytest.raises(TypeError, match=r"make_boxed_compiler expects a compiler callable.*int"):
        make_boxed_compiler(3)
    with pytest.raises(TypeError, match=r"make_boxed_func expects a callable, got str"):
        make_boxed_func("nope")
