"""The memory model lowers a graph with the C++ kernels of ordinary nodes written scalar only
(memory_models/scalar_codegen.py): the wrapper's buffer program must be the one a full lowering
(every kernel vectorized as Inductor writes it) gives, on every candidate cut a peak cap prices,
for several models, outer-loop fused nodes written scalar once their shape's answer is learned
included; outside a pricing lowering, Inductor's own compile is untouched."""

from __future__ import annotations

import pytest
import torch
from aot_partition.memory_models import inductor as inductor_memory
from aot_partition.memory_models import lowering_memo, scalar_codegen
from compiled_steps import compile_step, tiny_gpt, wide_convnet
from torch._inductor import metrics
from torch._inductor.cpu_vec_isa import pick_vec_isa

# Without a vector instruction set Inductor writes scalar kernels only: nothing to compare.
pytestmark = pytest.mark.skipif(not pick_vec_isa(), reason="this CPU has no vector ISA Inductor uses")


@pytest.fixture
def both_lowerings(monkeypatch):
    """Every graph the memory model lowers (once each: the memo starts empty) is lowered
    twice, scalar as priced and in full, and the two programs compared. Yields the count of
    graphs compared, of vector kernels each way, and of outer-loop nodes written with a learned
    answer (``learned_true``/``learned_false``) or learned from Inductor's run."""
    lowering_memo.clear_lowering_memo()
    scalar_codegen.clear_outer_loop_outcomes()
    real = inductor_memory._lower
    real_key = scalar_codegen.outer_loop_key
    seen = {"graphs": 0, "vector_kernels_scalar": 0, "vector_kernels_full": 0,
            "learned_true": 0, "learned_false": 0, "learning": 0}

    def key(node):
        found = real_key(node)
        answer = scalar_codegen._OUTER_LOOP_OUTCOMES.get(found)
        seen["learning" if answer is None else f"learned_{str(answer).lower()}"] += 1
        return found

    def lowered(gm, values, **kwargs):
        import copy

        before = metrics.generated_cpp_vec_kernel_count
        fast = real(copy.deepcopy(gm), values, **kwargs)
        seen["vector_kernels_scalar"] += metrics.generated_cpp_vec_kernel_count - before
        with monkeypatch.context() as env:
            env.setenv("AOT_PARTITION_SCALAR_PRICING", "0")
            before = metrics.generated_cpp_vec_kernel_count
            full = real(gm, values, **kwargs)
            seen["vector_kernels_full"] += metrics.generated_cpp_vec_kernel_count - before
        assert fast == full, (
            f"the scalar-priced {'backward' if kwargs['is_backward'] else 'forward'} differs "
            f"from the full lowering:\nscalar: {fast}\nfull:   {full}")
        seen["graphs"] += 1
        return fast

    monkeypatch.setattr(inductor_memory, "_lower", lowered)
    monkeypatch.setattr(scalar_codegen, "outer_loop_key", key)
    yield seen
    lowering_memo.clear_lowering_memo()
    scalar_codegen.clear_outer_loop_outcomes()


def _compile_under(model, budget, **options):
    try:
        compile_step(model, budget, **options)
    except Exception as error:  # a refused cap priced its candidates all the same
        assert "peak" in str(error), error


# The torch range (.ci/torch_range, "not slow") runs the first: the C++ back end's internals
# this relies on are exercised by it on every release; the main suite runs all three.
# ``outer_loops``: a transformer's softmaxes and layer norms are outer-loop fused nodes; after
# the first of each shape, each is written scalar with Inductor's check answered from what it
# said for that shape. Both answers (the local buffer kept; dropped because the vector
# kernels' loops split differently: a cross-entropy's backward) are given, and every program
# is still the full lowering's.
@pytest.mark.parametrize("model, budget, options, outer_loops", [
    (lambda: tiny_gpt(vocab=256, dim=64, seq=64, batch=4), "0.8 peak", {}, True),
    pytest.param(lambda: tiny_gpt(vocab=1024, dim=32, seq=64, batch=4), "0.6 peak", {"split": 4},
                 False, marks=pytest.mark.slow),
    pytest.param(lambda: wide_convnet(width=64, batch=4, side=8), "0.85 peak", {}, False,
                 marks=pytest.mark.slow),
], ids=["gpt-softmax-layernorm", "gpt-split-head", "convnet"])
def test_every_candidate_priced_scalar_prices_as_the_full_lowering(
        both_lowerings, model, budget, options, outer_loops):
    _compile_under(model(), budget, **options)
    assert both_lowerings["graphs"] >= 4  # a cap search: several cuts priced
    # The fast lowering did skip vector kernels the full one wrote.
    assert both_lowerings["vector_kernels_scalar"] < both_lowerings["vector_kernels_full"]
    if outer_loops:
        assert both_lowerings["learning"] > 0
        assert both_lowerings["learned_true"] > 0
        assert both_lowerings["learned_false"] > 0


def test_inductor_compiles_outside_pricing_keep_their_vector_kernels():
    from aot_partition.memory_models.scalar_codegen import scalar_kernels_where_memory_allows

    def f(x):
        return (x.sin() * 2).sum(-1)

    x = torch.randn(64, 64)
    with scalar_kernels_where_memory_allows():
        pass  # the hooks are installed from here on, inactive outside the context
    torch._dynamo.reset()
    before = metrics.generated_cpp_vec_kernel_count
    torch.compile(f, backend="inductor")(x)
    assert metrics.generated_cpp_vec_kernel_count > before
