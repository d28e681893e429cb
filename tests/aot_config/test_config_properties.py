"""Property tests: any mix of flag changes survives save/load and codegen, and hashes agree."""

from __future__ import annotations

import warnings

from aot_config import dynamo, functorch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FLAG_SETS = {"functorch": functorch, "dynamo": dynamo}
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _reset(config) -> None:
    config._overrides.clear()


@SETTINGS
@given(set_name=st.sampled_from(sorted(FLAG_SETS)), data=st.data())
def test_random_changes_round_trip(set_name: str, data, alternative_value) -> None:
    config = FLAG_SETS[set_name]
    names = data.draw(st.lists(st.sampled_from(sorted(config.flags())), unique=True, max_size=12))
    _reset(config)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inert flags warn on write
            for name in names:
                setattr(
                    config, name, alternative_value(config.flags()[name], getattr(config, name))
                )
            expected, expected_hash = config.to_dict(), config.get_hash()
            blob, source = config.save_config(), config.codegen_config()
            saved = set(config.save_config_portable())

            _reset(config)
            config.load_config(blob)
            for name in saved:
                assert getattr(config, name) == expected[name]

            _reset(config)
            exec(compile(source, "<codegen>", "exec"), {})
            assert config.to_dict() == expected
            assert config.get_hash() == expected_hash
            assert all(config.is_default(n) == (n not in names) for n in config.flags())
    finally:
        _reset(config)
