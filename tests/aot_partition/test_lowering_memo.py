"""Each distinct graph lowered once per process for the Inductor memory model
(memory_models/lowering_memo.py): a graph priced again is handed back without lowering, equal
to a fresh lowering; a graph that differs in anything the lowering reads (a shape, a stride, a
dtype, Inductor's config, the lowering's arguments) is lowered again; symbolic shapes and
failures are never kept. (A refused cap's best-effort compile pricing from the memo:
test_pipeline_peak_budget.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
from aot_partition.memory_models import inductor as inductor_memory
from aot_partition.memory_models import lowering_memo
from aot_partition.memory_models.inductor import lower_for_memory, lower_partition
from compiled_steps import compile_step, tiny_gpt


@pytest.fixture(scope="module")
def partition():
    """The tiny GPT's forward and backward as our partitioner returned them (fake values)."""
    step = compile_step(tiny_gpt(vocab=64, dim=32, seq=16, batch=2), 1.0)
    return step.partitions[0]


@pytest.fixture
def lowerings(monkeypatch):
    """Counts real lowerings (the memo's misses), starting from an empty memo."""
    lowering_memo.clear_lowering_memo()
    calls: list[bool] = []
    real = inductor_memory._lower

    def counting(gm, values, **kwargs):
        calls.append(kwargs["is_backward"])
        return real(gm, values, **kwargs)

    monkeypatch.setattr(inductor_memory, "_lower", counting)
    yield calls
    lowering_memo.clear_lowering_memo()


def test_a_graph_priced_again_is_not_lowered_again_and_prices_the_same(partition, lowerings):
    fw, bw = partition
    first = lower_partition(fw, bw)
    assert lowerings == [False, True]
    again = lower_partition(copy.deepcopy(fw), copy.deepcopy(bw))
    assert lowerings == [False, True]  # both graphs from the memo, a copy of each as well
    assert lowering_memo.lowering_memo_stats()["hits"] == 2
    assert again.forward == first.forward and again.backward == first.backward
    assert again.timeline().peak_bytes == first.timeline().peak_bytes
    # The memo off: lowered again, and the same program.
    lowering_memo.clear_lowering_memo()
    fresh = lower_partition(fw, bw)
    assert lowerings == [False, True, False, True]
    assert fresh.forward == first.forward and fresh.backward == first.backward


def _key(gm, values, **changes):
    arguments = {"is_backward": False, "donated": (), "workspace": False, "user_outputs": None,
                 "input_strides": None, **changes}
    return lowering_memo.lowering_memo_key(gm, values, **arguments)


def test_what_the_lowering_reads_is_in_the_key(partition):
    fw, _ = partition
    values = [n.meta.get("val") for n in fw.graph.find_nodes(op="placeholder")]
    key = _key(fw, values)
    assert key is not None and key == _key(copy.deepcopy(fw), values)
    # The lowering's own arguments.
    assert _key(fw, values, user_outputs=0) != key
    assert _key(fw, values, is_backward=True) != key
    assert _key(fw, values, workspace=True) != key
    # Inductor's config (a flag that changes its fusion).
    from torch._inductor import config as inductor_config

    with inductor_config.patch(max_fusion_size=2):
        assert _key(fw, values) != key
    # A placeholder of another layout, dtype or shape; two placeholders sharing a storage.
    mode = next(v.fake_mode for v in values if isinstance(v, torch.Tensor))
    index, tensor = next((i, v) for i, v in enumerate(values)
                         if isinstance(v, torch.Tensor) and v.dim() == 2)
    with mode:
        for other in (tensor.t().contiguous().t(), tensor.double(), tensor[:1]):
            assert _key(fw, [*values[:index], other, *values[index + 1:]]) != key
        twin = next(i for i, v in enumerate(values) if i != index
                    and isinstance(v, torch.Tensor) and v.shape == tensor.shape
                    and v.dtype == tensor.dtype) if any(
            i != index and isinstance(v, torch.Tensor) and v.shape == tensor.shape
            and v.dtype == tensor.dtype for i, v in enumerate(values)) else None
        if twin is not None:
            shared = [*values]
            shared[twin] = tensor.view(tensor.shape)
            assert _key(fw, shared) != key
    # Another graph: its code.
    other = copy.deepcopy(fw)
    node = next(n for n in other.graph.nodes if n.op == "call_function")
    with other.graph.inserting_after(node):
        extra = other.graph.call_function(torch.ops.aten.neg.default, (node,))
    node.replace_all_uses_with(extra, delete_user_cb=lambda user: user is not extra)
    other.recompile()
    assert _key(other, values) != key


def test_symbolic_shapes_are_never_kept():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    symbolic = mode.from_tensor(torch.randn(4, 8), symbolic_context=context)
    static = FakeTensorMode().from_tensor(torch.randn(4, 8))
    assert isinstance(symbolic.shape[0], torch.SymInt)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert _key(gm, [static]) is not None
    assert _key(gm, [symbolic]) is None
    assert _key(gm, [symbolic.shape[0]]) is None


def test_the_memo_can_be_turned_off(partition, lowerings, monkeypatch):
    fw, _ = partition
    lower_for_memory(fw, is_backward=False)
    lower_for_memory(fw, is_backward=False)
    assert len(lowerings) == 1
    monkeypatch.setenv("AOT_PARTITION_LOWERING_MEMO", "0")
    lower_for_memory(fw, is_backward=False)
    assert len(lowerings) == 2


def test_a_failed_lowering_is_not_kept(partition, monkeypatch):
    lowering_memo.clear_lowering_memo()
    fw, _ = partition

    def failing(gm, values, **kwargs):
        raise inductor_memory.InductorMemoryError("no lowering")

    monkeypatch.setattr(inductor_memory, "_lower", failing)
    with pytest.raises(inductor_memory.InductorMemoryError):
        lower_for_memory(fw, is_backward=False)
    monkeypatch.undo()
    assert lowering_memo.lowering_memo_stats()["kept"] == 0
    lower_for_memory(fw, is_backward=False)
    assert lowering_memo.lowering_memo_stats()["kept"] == 1
    lowering_memo.clear_lowering_memo()


def _with_chunks(gm, chunks):
    """A copy of ``gm`` whose split calls take ``chunks`` chunks."""
    from aot_partition.memory_models.chunk_scratch import chunked_calls

    copied = copy.deepcopy(gm)
    calls = chunked_calls(copied.graph)
    for node in calls:
        node.args = (*node.args[:-1], chunks)
    copied.recompile()
    return copied, len(calls)


def _scratch(program):
    return [e for e in program.events if isinstance(e, inductor_memory.Workspace)]


def test_the_split_at_another_chunk_count_is_not_lowered_again_and_prices_as_lowered(lowerings):
    """A peak cap tries the split at 2, 4, 8 ... chunks: the same graph but for the split op's
    chunk count, which changes only the op's scratch. The graph at 4 chunks is priced from the
    lowering at 2 (no lowering more), its scratch worked out at 4: the same program as a fresh
    lowering at 4, and another scratch than at 2 (one chunk's logits are half as large)."""
    step = compile_step(tiny_gpt(vocab=64, dim=32, seq=16, batch=2), 1.0, split=2,
                        compiler="nop")
    fw, bw = step.partitions[0]
    fw2, calls = _with_chunks(fw, 2)
    assert calls == 1  # the loss with its gradients, in the forward
    fw4, _ = _with_chunks(fw, 4)
    at_two = lower_partition(fw2, bw)
    assert lowerings == [False, True]
    at_four = lower_partition(fw4, copy.deepcopy(bw))
    assert lowerings == [False, True]  # both from the memo
    lowering_memo.clear_lowering_memo()
    fresh = lower_partition(fw4, bw)
    assert lowerings == [False, True, False, True]
    assert at_four.forward == fresh.forward and at_four.backward == fresh.backward
    assert at_four.timeline().peak_bytes == fresh.timeline().peak_bytes
    # The opposite case: the scratch was worked out again, not copied from 2 chunks.
    assert _scratch(at_two.forward) and _scratch(at_four.forward) != _scratch(at_two.forward)
    assert at_four.forward.chunk_counts == (4,) and at_two.forward.chunk_counts == (2,)
