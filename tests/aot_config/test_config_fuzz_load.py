"""Generated documents for load_config (issue 27): every input is applied or raises
ConfigLoadError (nothing applied); never another exception, never a hang."""

from __future__ import annotations

import json
import warnings

import pytest
from aot_config import ConfigLoadError, functorch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

FLAG_NAMES = sorted(functorch.flags())
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=10))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["tuple", "set", "frozenset", "dict", "object", "float",
                                         "x"]), inner, max_size=2)),
    max_leaves=8)
NAMES = st.one_of(st.sampled_from(FLAG_NAMES), st.text(max_size=12))


def _document(flags: dict, header: dict) -> bytes:
    body = {"format": "aot_config.save_config", "version": 1, "module": "aot_config.functorch",
            "flags": flags, **header}
    return json.dumps(body).encode()


DOCUMENTS = st.one_of(
    st.builds(_document, st.dictionaries(NAMES, VALUES, max_size=4),
              st.dictionaries(st.sampled_from(["format", "version", "module", "flags"]), VALUES,
                              max_size=1)),
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.integers(1, 3000).map(lambda n: ("{" + '"a":[' * n + "]" * n + "}").encode()),
    st.integers(1, 6000).map(lambda n: _document({"max_dist_from_bw": 0}, {}).replace(
        b":0}", b":" + b"7" * n + b"}")),
)


@pytest.mark.timeout(120)
@FUZZ
@given(data=DOCUMENTS, strict=st.booleans(), allow_pickle=st.booleans())
def test_any_document_is_applied_or_a_config_load_error(data, strict, allow_pickle):
    before = functorch.save_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            functorch.load_config(data, strict=strict, allow_pickle=allow_pickle)
        except ConfigLoadError as error:
            assert str(error).startswith("aot_config.functorch.load_config: "), error
            assert len(str(error)) < 2000
            assert functorch.save_config() == before  # all-or-nothing
