"""torch's own tests for region activation memory budgets, ported to our partitioner.

Source: the ``test_region_activation_memory_budget_*`` cases of pytorch's
test/dynamo/test_activation_checkpointing.py (pytorch/pytorch@0069a418). Each case runs
under ``torch.compile`` with an ``aot_eager``-like back end whose partitioner is ours
(``aot_partition.min_cut_rematerialization_partition``), and, where torch asserts a count,
also with torch's ``aot_eager`` for comparison. torch measures activation memory on CUDA
(``requested_bytes`` grown by one forward); here it is measured on CPU as the bytes of the
tensors the compiled forward saves for backward (pack hooks) whose storage is not an input's
or a parameter's: the same quantity, without a GPU.

Where torch raises (two budgets in one graph, a partial annotation) ours honours each region
by design (README, per-region budgets): those cases assert torch's error and then ours.
"""

from __future__ import annotations

import pytest
import torch
from aot_partition import min_cut_rematerialization_partition, region_memory_budget
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

pytestmark = pytest.mark.skipif(
    not hasattr(torch.autograd.graph, "region_activation_memory_budget"),
    reason="torch.autograd.graph.region_activation_memory_budget is missing (torch < 2.13)")

N = 64  # torch uses 1000 on CUDA; the saved bytes scale, the assertions do not change
NUM_LAYERS = 4


def _boxed_nop(gm, _inputs):
    return make_boxed_func(gm)


def ours_backend():
    """torch's ``aot_eager``, with our partitioner in place of torch's."""
    return aot_autograd(fw_compiler=_boxed_nop, bw_compiler=_boxed_nop,
                        partition_fn=min_cut_rematerialization_partition,
                        keep_inference_input_mutations=True)


BACKENDS = {"ours": ours_backend, "torch": lambda: "aot_eager"}


def _region(budget):
    return torch.autograd.graph.region_activation_memory_budget(budget)


def activation_bytes(step, keep_alive):
    """Bytes the forward of ``step`` saves for backward beyond ``keep_alive`` (inputs and
    parameters, alive anyway): torch's CUDA measure of activation memory, on CPU."""
    alive = {t.untyped_storage().data_ptr() for t in keep_alive}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in alive:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    step().backward()  # compile and warm up, as torch's test does
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = step()
    out.backward()
    return sum(saved.values())


class Layers(torch.nn.Module):
    """torch's model: ``NUM_LAYERS`` x (Linear(N, N) -> relu), then a sum, the whole forward
    under ``budget`` when one is given."""

    def __init__(self, budget=None, layers=NUM_LAYERS):
        super().__init__()
        self.budget = budget
        self.linears = torch.nn.ModuleList([torch.nn.Linear(N, N) for _ in range(layers)])

    def forward(self, x):
        if self.budget is None:
            return self._body(x)
        with _region(self.budget):
            return self._body(x)

    def _body(self, x):
        for linear in self.linears:
            x = linear(x).relu()
        return x.sum()


def _act_mem(module, x, backend):
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    return activation_bytes(lambda: compiled(x), [x, *module.parameters()])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_reduces_act_mem(backend):
    """A region budget 0.0 over the whole forward saves no activation; none saves some."""
    torch.manual_seed(0)
    x = torch.randn(N, N)
    assert _act_mem(Layers(), x, BACKENDS[backend]()) > 0
    assert _act_mem(Layers(budget=0.0), x, BACKENDS[backend]()) == 0


class TwoGraphs(torch.nn.Module):
    """torch's per-region model: two blocks under their own budgets, split by a graph break
    (two graphs, one budget each)."""

    def __init__(self, budget_a, budget_b):
        super().__init__()
        self.budget_a, self.budget_b = budget_a, budget_b
        self.linears_a = torch.nn.ModuleList([torch.nn.Linear(N, N) for _ in range(2)])
        self.linears_b = torch.nn.ModuleList([torch.nn.Linear(N, N) for _ in range(2)])

    def forward(self, x):
        with _region(self.budget_a):
            for linear in self.linears_a:
                x = linear(x).relu()
        torch._dynamo.graph_break()
        with _region(self.budget_b):
            for linear in self.linears_b:
                x = linear(x).relu()
            return x.sum()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_per_region(backend):
    """Both save > either one recomputing > both recomputing."""
    torch.manual_seed(0)
    x = torch.randn(N, N)
    mem = {budgets: _act_mem(TwoGraphs(*budgets), x, BACKENDS[backend]())
           for budgets in [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0)]}
    assert mem[1.0, 1.0] > mem[0.0, 1.0] > mem[0.0, 0.0]
    assert mem[1.0, 1.0] > mem[1.0, 0.0] > mem[0.0, 0.0]


def test_validation():
    """torch's context manager refuses non-floats and values outside [0, 1]; ours refuses
    the same values (a ValueError naming what is valid: it also takes byte caps)."""
    with pytest.raises(TypeError, match="expects a float"):
        _region(True)
    with pytest.raises(TypeError, match="expects a float"):
        _region("0.5")
    for bad in (2.0, -0.1):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            _region(bad)
    for bad in (True, "0.5", 2.0, -0.1):
        with pytest.raises(ValueError, match="region memory budget must be a fraction"):
            region_memory_budget(bad)


def test_eager_raises():
    """Outside a compiled (or traced) region the budget has no effect: both refuse it."""
    with pytest.raises(RuntimeError, match="inside a torch.compile region"):
        with _region(0.5):
            pass
    with pytest.raises(RuntimeError, match="only takes effect while a graph is traced"):
        with region_memory_budget(0.5):
            pass


def test_ours_is_accepted_under_aot_function():
    """The must-not-fire side: aot_function traces ``fn`` twice (fake metadata pass, then the
    joint): ours is accepted in both and its budget reaches the partitioner (0.0 over the
    whole forward: no activation saved; without it, one is)."""
    from functorch.compile import aot_function

    def fn(x, w, budget):
        with region_memory_budget(budget) if budget is not None else _Null():
            return (x @ w).relu().sin().sum()

    def saved(budget):
        gen = torch.Generator().manual_seed(0)
        x, w = (torch.randn(N, N, generator=gen, requires_grad=True) for _ in range(2))
        compiled = aot_function(lambda x, w: fn(x, w, budget), _boxed_nop,
                                partition_fn=min_cut_rematerialization_partition)
        return activation_bytes(lambda: compiled(x, w), [x, w])

    assert saved(None) > 0
    assert saved(0.0) == 0


def _two_regions(x, y):
    with _region(0.3):
        a = (torch.mm(x, y) + 1).relu()
    with _region(0.8):
        return (torch.mm(a, y) + 1).relu()


def _partial_region(x, y):
    with _region(0.3):
        a = (torch.mm(x, y) + 1).relu()
    return (a * 2).relu()  # outside the region


def _grads(fn, backend, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 8, generator=gen, requires_grad=True)
    y = torch.randn(8, 8, generator=gen, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True) if backend else fn
    compiled(x, y).sum().backward()
    return x.grad, y.grad


def _eager(fn):
    """``fn`` run eagerly: torch's context manager refuses eager mode, so no regions."""
    def run(x, y):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.autograd.graph, "region_activation_memory_budget",
                          lambda _budget: _Null())
            return fn(x, y)
    return run


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("fn,torch_error", [(_two_regions, "conflicting budgets"),
                                            (_partial_region, "must cover the entire forward")])
def test_conflict_and_partial_annotation(fn, torch_error):
    """torch raises for two budgets in one graph and for a partial annotation; ours
    partitions both (each region under its own budget, the rest under the global one) and
    gives eager's gradients."""
    with pytest.raises(Exception, match=torch_error):
        _grads(fn, "aot_eager")
    for got, want in zip(_grads(fn, ours_backend()), _grads(_eager(fn), None)):
        torch.testing.assert_close(got, want)


needs_nested_region = pytest.mark.skipif(
    not hasattr(torch.compiler, "nested_compile_region")
    or not hasattr(torch._dynamo.config, "inline_single_use_invoke_subgraph"),
    reason="torch.compiler.nested_compile_region or dynamo's "
           "inline_single_use_invoke_subgraph flag is missing")


@needs_nested_region
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_covers_invoke_subgraph(backend):
    """A budget 0.0 around a call of a nested compile region (kept as an invoke_subgraph
    HOP) and the reduction after it covers the HOP's body too: no activation is saved."""
    torch.manual_seed(0)
    linears = torch.nn.ModuleList([torch.nn.Linear(N, N) for _ in range(NUM_LAYERS)])

    @torch.compiler.nested_compile_region
    def region(x):
        for linear in linears:
            x = linear(x).relu()
        return x

    def build(budget):
        def fn(x):
            if budget is None:
                return region(x).sum()
            with _region(budget):
                return region(x).sum()
        return fn

    x = torch.randn(N, N)
    with torch._dynamo.config.patch(inline_single_use_invoke_subgraph=False):
        mems = []
        for budget in (None, 0.0):
            torch._dynamo.reset()
            compiled = torch.compile(build(budget), backend=BACKENDS[backend](), fullgraph=True)
            mems.append(activation_bytes(lambda c=compiled: c(x), [x, *linears.parameters()]))
    assert mems[0] > 0
    assert mems[1] == 0


@needs_nested_region
def test_distinct_per_invoke_subgraph():
    """Different budgets in two invoke_subgraph regions of one graph: torch raises (its
    agreement check recurses into the bodies); ours keeps each body under its own budget and
    gives eager's gradients."""
    gen = torch.Generator().manual_seed(0)
    wa = torch.randn(8, 8, generator=gen, requires_grad=True)
    wb = torch.randn(8, 8, generator=gen, requires_grad=True)

    @torch.compiler.nested_compile_region
    def region_a(x):
        with _region(0.3):
            return (x @ wa).relu()

    @torch.compiler.nested_compile_region
    def region_b(x):
        with _region(0.8):
            return (x @ wb).relu()

    def fn(x):
        return region_b(region_a(x)).sum()

    def run(backend):
        for w in (wa, wb):
            w.grad = None
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        torch._dynamo.reset()
        torch.compile(fn, backend=backend, fullgraph=True)(x).backward()
        return [x.grad, wa.grad, wb.grad]

    with torch._dynamo.config.patch(inline_single_use_invoke_subgraph=False):
        with pytest.raises(Exception, match="conflicting budgets"):
            run("aot_eager")
        got = run(ours_backend())
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for w in (wa, wb):
        w.grad = None
    ((x @ wa).relu() @ wb).relu().sum().backward()
    for got_grad, want in zip(got, [x.grad, wa.grad, wb.grad]):
        torch.testing.assert_close(got_grad, want)
