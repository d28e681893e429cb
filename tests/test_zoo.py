import pytest
import torch
from zoo import ZOO, assert_matches_eager, make_case


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_runs_and_matches_itself(name):
    case = make_case(name)
    assert_matches_eager(case, lambda m: m)


def test_assert_matches_eager_catches_a_wrong_model():
    case = make_case("mlp")
    with pytest.raises(AssertionError):
        assert_matches_eager(case, lambda m: (lambda x: m(x) * 1.01))


def test_gpt_sdpa_equals_written_out_attention():
    a, b = make_case("gpt"), make_case("gpt_sdpa")
    b.module.load_state_dict(a.module.state_dict())
    torch.testing.assert_close(a.module(*a.inputs), b.module(*a.inputs), atol=1e-5, rtol=1e-5)
