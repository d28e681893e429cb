"""Attribute access on config modules: reads, checked writes, errors, aliases, inert flags."""

from __future__ import annotations

import warnings

import pytest
from aot_config import ConfigModule, Flag, InertFlagWarning, dynamo, functorch


def test_installed_module_is_the_config_object() -> None:
    import aot_config

    assert isinstance(functorch, ConfigModule)
    assert aot_config.functorch is functorch
    assert aot_config.dynamo is dynamo
    assert functorch.cse is True
    functorch.cse = False
    assert functorch.cse is False
    assert not functorch.is_default("cse")


def test_string_for_bool_flag_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"functorch\.cse = 'yes' is not valid: expected bool"):
        functorch.cse = "yes"
    assert functorch.cse is True


def test_int_one_is_not_a_bool_and_bool_is_not_an_int() -> None:
    with pytest.raises(ValueError, match=r"debug_assert = 1 is not valid: expected bool"):
        functorch.debug_assert = 1
    with pytest.raises(ValueError, match=r"max_dist_from_bw = True is not valid: expected int"):
        functorch.max_dist_from_bw = True


def test_float_flag_accepts_int_and_stores_float() -> None:
    functorch.activation_memory_budget = 0
    assert functorch.activation_memory_budget == 0.0
    assert isinstance(functorch.activation_memory_budget, float)


def test_unknown_flag_suggests_closest_name() -> None:
    with pytest.raises(
        AttributeError,
        match=r"no flag 'activation_memory_budgt'; did you mean 'activation_memory_budget'\?",
    ):
        functorch.activation_memory_budgt  # noqa: B018
    with pytest.raises(AttributeError, match=r"no flag 'ces'; did you mean 'cse'\?"):
        functorch.ces = True


def test_unknown_flag_without_close_match_has_no_suggestion() -> None:
    with pytest.raises(AttributeError, match=r"no flag 'zzzzzz'$"):
        functorch.zzzzzz  # noqa: B018


def test_helpers_stay_ordinary_attributes() -> None:
    assert callable(dynamo.get_optimize_ddp_mode)
    assert "get_optimize_ddp_mode" not in dynamo.flags()
    assert "cse" in dir(functorch)


def test_delattr_resets_and_hides_the_flag_until_the_next_assignment() -> None:
    functorch.cse = False
    del functorch.cse
    # As torch's config does, and as unittest.mock.patch needs (see test_config_threads.py).
    assert not hasattr(functorch, "cse")
    with pytest.raises(AttributeError, match=r"functorch\.cse was deleted in this thread"):
        functorch.cse  # noqa: B018
    assert functorch.is_default("cse")
    assert functorch.to_dict()["cse"] is True
    functorch.cse = True
    assert functorch.cse is True


def test_reset_restores_defaults() -> None:
    functorch.cse = False
    functorch.max_dist_from_bw = 3
    functorch.reset("cse")
    assert functorch.cse is True
    assert functorch.max_dist_from_bw == 3
    functorch.reset()
    assert functorch.max_dist_from_bw == 1000
    assert all(functorch.is_default(name) for name in functorch.flags())
    with pytest.raises(AttributeError, match="no flag 'csee'; did you mean 'cse'"):
        functorch.reset("csee")


def test_get_type_and_is_default() -> None:
    assert functorch.get_type("activation_memory_budget") is float
    assert dynamo.get_type("repro_after") == (str | None)
    assert functorch.is_default("min_cut_solver")
    functorch.min_cut_solver = "networkx"
    assert not functorch.is_default("min_cut_solver")
    with pytest.raises(AttributeError, match="no flag 'nope'"):
        functorch.is_default("nope")


def test_mutable_defaults_are_not_shared(make_config) -> None:
    config = make_config(names=Flag({"a"}, type=set[str], doc="names"))
    config.names.add("b")
    assert config.names == {"a", "b"}
    assert config.flags()["names"].default == {"a"}
    assert not config.is_default("names")


def test_deprecated_alias_forwards_with_warning(make_config) -> None:
    config = make_config(recompile_limit=Flag(8, aliases=("cache_size_limit",), doc="limit"))
    with pytest.warns(
        DeprecationWarning, match=r"cache_size_limit is deprecated; use .*recompile_limit"
    ):
        config.cache_size_limit = 3
    assert config.recompile_limit == 3
    with pytest.warns(DeprecationWarning, match="cache_size_limit is deprecated"):
        assert config.cache_size_limit == 3
    with pytest.raises(ValueError, match=r"recompile_limit = 'x' is not valid"):
        with pytest.warns(DeprecationWarning):
            config.cache_size_limit = "x"


def test_alias_clashing_with_flag_is_rejected(make_config) -> None:
    with pytest.raises(ValueError, match="alias 'b' is already a flag or alias"):
        make_config(a=Flag(1, aliases=("b",)), b=Flag(2))


def test_inert_flag_is_accepted_with_warning() -> None:
    with pytest.warns(InertFlagWarning, match=r"dynamic_shapes does nothing: legacy config"):
        dynamo.dynamic_shapes = False
    assert dynamo.dynamic_shapes is False
    for name in ("optimize_ddp_lazy_compile", "report_guard_failures"):
        with pytest.warns(InertFlagWarning, match=f"{name} does nothing"):
            setattr(dynamo, name, not getattr(dynamo, name))
    with pytest.warns(InertFlagWarning, match="skipfiles_inline_module_allowlist does nothing"):
        dynamo.skipfiles_inline_module_allowlist = {"a": 1}


def test_active_flags_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dynamo.compiled_autograd = True
        functorch.cse = False


def test_none_default_needs_explicit_type() -> None:
    with pytest.raises(TypeError, match=r"Flag\(None\) needs an explicit type="):
        Flag(None)


def test_invalid_declared_default_is_rejected(make_config) -> None:
    with pytest.raises(ValueError, match=r"\.mode = 'c' is not valid: expected one of 'a', 'b'"):
        make_config(mode=Flag("c", choices=("a", "b")))


def test_module_cannot_be_installed_twice() -> None:
    from aot_config import install_config_module

    with pytest.raises(TypeError, match="already a config module"):
        install_config_module(functorch)


def test_importing_aot_config_does_not_import_torch(run_python) -> None:
    result = run_python(
        "import sys, aot_config\n"
        "from aot_config import functorch, dynamo, cli\n"
        "print('torch' in sys.modules)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_inert_flag_set_to_its_default_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dynamo.dynamic_shapes = True
        dynamo.load_config(dynamo.save_config())


RELOAD_SCRIPT = """
import importlib, os
from aot_config import functorch
functorch.cse = False
os.environ["AOT_MIN_CUT_SOLVER"] = "networkx"
importlib.reload(functorch)
print(functorch.cse, functorch.min_cut_solver, functorch.value_source("min_cut_solver"))
functorch.activation_memory_budget = 0.5
print(functorch.activation_memory_budget)
"""


def test_reload_reinstalls_and_rereads_environment(run_python) -> None:
    result = run_python(RELOAD_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "networkx", "env", "AOT_MIN_CUT_SOLVER", "0.5"]


@pytest.mark.parametrize("name", ["patch", "flags", "get_hash", "to_dict"])
def test_flag_named_like_a_method_is_rejected(make_config, name: str) -> None:
    with pytest.raises(
        ValueError, match=rf"\.{name}: a flag cannot be named like the config method"
    ):
        make_config(**{name: Flag(True)})
