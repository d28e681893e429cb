"""Property test: random small programs partitioned by our min-cut compute what eager computes.

Hypothesis draws a program: a list of steps, each applied to one or two values of a small pool
of live tensors (the most recent few values), so the graph is a DAG with reuse. Steps are
linear layers, matmuls, pointwise ops, reductions broadcast back, views, dropout (p > 0,
training) and training-mode batch norm (running stats are buffers updated in place). The
program runs as an ``nn.Module`` through ``aot_module`` with nop compilers and our
``min_cut_rematerialization_partition`` at activation-memory budgets 1.0, 0.5 and 0.0, and (for
fewer examples) through ``torch.compile(backend="aot_pipeline")``. Outputs, every parameter
gradient, the input gradient and every buffer must equal eager's on a deep copy of the module,
with the RNG seeded right before each forward (on CPU, eager and AOTAutograd draw the same
dropout masks, so a recomputed random op must replay the forward's draws).

Profiles: the default run is bounded and reproducible (derandomized); ``HYPOTHESIS_PROFILE=slow``
runs many more, randomized examples. The profiles are applied to these tests only (through
``@settings``), so loading them never changes the settings of other hypothesis tests.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass

import aot_partition
import pytest
import torch
import torch.nn.functional as F
from aot_config import functorch as functorch_config
from functorch.compile import aot_module, make_boxed_func
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from torch import nn

# No explain phase: it reruns variants of a failing program, each a fresh compile.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
settings.register_profile(
    "aot-programs-default",
    max_examples=25,
    phases=PHASES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "aot-programs-slow",
    max_examples=400,
    phases=PHASES,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(
    "aot-programs-slow" if os.environ.get("HYPOTHESIS_PROFILE") == "slow"
    else "aot-programs-default")
# torch.compile (Dynamo + AOTAutograd, one budget per program): half as many examples.
COMPILE_PROFILE = settings(PROFILE, max_examples=max(1, PROFILE.max_examples // 2))

DTYPE = torch.float64
TOL = {"atol": 1e-7, "rtol": 1e-7}
BUDGETS = (1.0, 0.5, 0.0)
POOL = 4  # live values a step may read: the most recent ones
MAX_STEPS = 8
DIMS = (1, 2, 3, 4, 6, 8, 16)

UNARY = ("relu", "gelu", "tanh", "sigmoid", "exp")
BINARY = ("add", "mul")
REDUCTIONS = ("sum", "mean", "amax")
COMBINE = ("sub", "mul", "expand")  # how a keepdim reduction is broadcast back
DROPOUT_P = (0.1, 0.3, 0.5)


# ---- programs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One step: ``op`` applied to values ``args`` (indices into all values so far; value 0 is
    the input); ``attrs`` are the op's constants. Step ``i`` produces value ``i + 1``."""

    op: str
    args: tuple[int, ...]
    attrs: tuple = ()

    def __repr__(self) -> str:
        """The step as the code it runs (what a falsifying example shows)."""
        op, attrs = self.op, self.attrs
        x, *rest = (f"v{a}" for a in self.args)
        if op == "unary":
            return {"exp": f"torch.exp({x}.clamp(-5.0, 5.0))",
                    "gelu": f"F.gelu({x})"}.get(attrs[0], f"torch.{attrs[0]}({x})")
        if op == "linear":
            return f"nn.Linear({attrs[0]}, {attrs[1]})({x})"
        if op == "matmul":
            return f"{x} @ {rest[0]}{'.T' if attrs[0] else ''} / {x}.shape[1]"
        if op == "binary":
            return f"{x} {'+' if attrs[0] == 'add' else '*'} {rest[0]}"
        if op == "reduce":
            reduced = f"{x}.{attrs[0]}({attrs[1]}, keepdim=True)"
            return {"sub": f"{x} - {reduced}", "mul": f"{x} * {reduced}",
                    "expand": f"{reduced}.expand_as({x})"}[attrs[2]]
        if op in ("view", "reshape"):
            return f"{x}.{op}({attrs[0]}, {attrs[1]})"
        if op == "transpose":
            return f"{x}.transpose(0, 1)"
        if op == "slice":
            dim, start, stop, stride = attrs
            return f"{x}[{':, ' if dim else ''}{start}:{stop}:{stride}]"
        if op == "dropout":
            return f"F.dropout({x}, {attrs[0]}, training=True)"
        return f"nn.BatchNorm1d({attrs[0]})({x})"  # training mode: updates running stats

    def _repr_pretty_(self, printer, _cycle) -> None:  # hypothesis prints with this
        printer.text(repr(self))


@dataclass(frozen=True)
class Program:
    input_shape: tuple[int, int]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # values no step reads (so no step is dead code)

    def __repr__(self) -> str:
        lines = [f"v0 = input{self.input_shape}"]
        lines += [f"v{i + 1} = {step!r}" for i, step in enumerate(self.steps)]
        lines.append(f"return {', '.join(f'v{o}' for o in self.outputs)}")
        return "Program(\n    " + "\n    ".join(lines) + "\n)"

    def _repr_pretty_(self, printer, _cycle) -> None:  # hypothesis prints with this
        printer.text(repr(self))


@dataclass(frozen=True)
class _Value:
    shape: tuple[int, int]
    contiguous: bool  # known to be contiguous (only then may a step .view() it)


def _factorizations(numel: int) -> list[tuple[int, int]]:
    return [(r, numel // r) for r in range(1, numel + 1) if numel % r == 0]


@st.composite
def programs(draw, exclude: frozenset[str] = frozenset()) -> Program:
    """A random program; ``exclude`` leaves step kinds out (for local experiments only)."""
    # Mostly tiny; 96 rows make values bigger than a CPU RNG state (5,056 bytes), so that the
    # partitioner may recompute (and must then replay) a dropout below budget 1.0.
    rows = draw(st.sampled_from((4, 2, 3, 6, 96)))
    cols = draw(st.sampled_from((4, 2, 3, 8, 16)))
    values = [_Value((rows, cols), True)]
    steps: list[Step] = []
    # One "another step?" choice per step (as st.lists draws), so that the shrinker can delete
    # any step, not only the last ones.
    while len(steps) < MAX_STEPS and (not steps or draw(st.integers(0, 5)) > 0):
        # The pool, most recent value first: a step that reads the latest value shrinks best.
        pool = list(range(len(values) - 1, max(-1, len(values) - 1 - POOL), -1))
        ops = ["unary", "linear", "matmul", "binary", "reduce", "view", "reshape",
               "transpose", "slice", "dropout", "batchnorm"]
        if not any(values[v].contiguous for v in pool):
            ops.remove("view")
        if not any(values[v].shape[0] >= 2 for v in pool):
            ops.remove("batchnorm")
        ops = [op for op in ops if op not in exclude]
        op = draw(st.sampled_from(ops))
        if op == "view":
            src = draw(st.sampled_from([v for v in pool if values[v].contiguous]))
        elif op == "batchnorm":
            src = draw(st.sampled_from([v for v in pool if values[v].shape[0] >= 2]))
        else:
            src = draw(st.sampled_from(pool))
        (r, c), contiguous = values[src].shape, values[src].contiguous
        if op == "unary":
            step = Step(op, (src,), (draw(st.sampled_from(UNARY)),))
            shape = (r, c)
        elif op == "linear":
            out = draw(st.sampled_from(DIMS))
            step, shape, contiguous = Step(op, (src,), (c, out)), (r, out), True
        elif op == "matmul":
            # src @ other (other has c rows) or src @ other.T (other has c columns)
            choices = [(v, False) for v in pool if values[v].shape[0] == c]
            choices += [(v, True) for v in pool if values[v].shape[1] == c]
            other, transpose = draw(st.sampled_from(choices))
            n = values[other].shape[0 if transpose else 1]
            step, shape, contiguous = Step(op, (src, other), (transpose,)), (r, n), True
        elif op == "binary":
            other = draw(st.sampled_from([v for v in pool if values[v].shape == (r, c)]))
            step = Step(op, (src, other), (draw(st.sampled_from(BINARY)),))
            shape, contiguous = (r, c), contiguous and values[other].contiguous
        elif op == "reduce":
            attrs = (draw(st.sampled_from(REDUCTIONS)), draw(st.sampled_from((0, 1))),
                     draw(st.sampled_from(COMBINE)))
            step, shape = Step(op, (src,), attrs), (r, c)
            contiguous = contiguous and attrs[2] != "expand"
        elif op in ("view", "reshape"):
            shape = draw(st.sampled_from(_factorizations(r * c)))
            step = Step(op, (src,), shape)
        elif op == "transpose":
            step, shape, contiguous = Step(op, (src,)), (c, r), False
        elif op == "slice":
            dim = draw(st.sampled_from((0, 1)))
            size = (r, c)[dim]
            start = draw(st.integers(0, size - 1))
            stop = draw(st.integers(start + 1, size))
            stride = draw(st.sampled_from((1, 2)))
            length = len(range(start, stop, stride))
            step = Step(op, (src,), (dim, start, stop, stride))
            shape = (length, c) if dim == 0 else (r, length)
            contiguous = contiguous and (dim == 0 and stride == 1 or shape == (r, c))
        elif op == "dropout":
            step, shape = Step(op, (src,), (draw(st.sampled_from(DROPOUT_P)),)), (r, c)
        else:  # batchnorm
            step, shape = Step(op, (src,), (c,)), (r, c)
        steps.append(step)
        values.append(_Value(shape, contiguous))
    read = {a for step in steps for a in step.args}
    outputs = tuple(v for v in range(1, len(values)) if v not in read)
    return Program((rows, cols), tuple(steps), outputs)


class ProgramModule(nn.Module):
    """Runs a Program; its linear layers and batch norms are submodules."""

    def __init__(self, program: Program) -> None:
        super().__init__()
        self.steps = program.steps
        self.outputs = program.outputs
        self.layers = nn.ModuleDict()
        for i, step in enumerate(program.steps):
            if step.op == "linear":
                self.layers[f"s{i}"] = nn.Linear(*step.attrs, dtype=DTYPE)
            elif step.op == "batchnorm":
                self.layers[f"s{i}"] = nn.BatchNorm1d(step.attrs[0], dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x]
        for i, step in enumerate(self.steps):
            values.append(self._apply_step(i, step, [values[a] for a in step.args]))
        return tuple(values[o] for o in self.outputs)

    def _apply_step(self, i: int, step: Step, args: list[torch.Tensor]) -> torch.Tensor:
        op, attrs = step.op, step.attrs
        x = args[0]
        if op in ("linear", "batchnorm"):
            return self.layers[f"s{i}"](x)
        if op == "unary":
            if attrs[0] == "exp":
                return torch.exp(x.clamp(-5.0, 5.0))
            return {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh,
                    "sigmoid": torch.sigmoid}[attrs[0]](x)
        if op == "matmul":
            other = args[1].transpose(0, 1) if attrs[0] else args[1]
            return torch.matmul(x, other) / x.shape[1]  # scaled: magnitudes stay bounded
        if op == "binary":
            return x + args[1] if attrs[0] == "add" else x * args[1]
        if op == "reduce":
            how, dim, combine = attrs
            if how == "sum":
                reduced = x.sum(dim, keepdim=True)
            elif how == "mean":
                reduced = x.mean(dim, keepdim=True)
            else:
                reduced = x.amax(dim, keepdim=True)
            if combine == "sub":
                return x - reduced
            if combine == "mul":
                return x * reduced
            return reduced.expand_as(x)
        if op == "view":
            return x.view(*attrs)
        if op == "reshape":
            return x.reshape(*attrs)
        if op == "transpose":
            return x.transpose(0, 1)
        if op == "slice":
            dim, start, stop, stride = attrs
            return x[start:stop:stride] if dim == 0 else x[:, start:stop:stride]
        if op == "dropout":
            return F.dropout(x, attrs[0], training=True)
        raise AssertionError(f"unknown step {step!r}")


# ---- running and comparing ---------------------------------------------------------------------

def _nop(gm, _example_inputs):
    return make_boxed_func(gm)


def _aot_min_cut(module: nn.Module):
    return aot_module(module, fw_compiler=_nop, bw_compiler=_nop,
                      partition_fn=aot_partition.min_cut_rematerialization_partition)


def _loss(outputs: tuple[torch.Tensor, ...], seed: int) -> torch.Tensor:
    """A scalar that weighs every output element differently (fixed random weights)."""
    gen = torch.Generator().manual_seed(seed)
    return sum((out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum()
               for out in outputs)


def _run(call, module: nn.Module, x: torch.Tensor, seed: int, budget: float | None = None):
    """One forward (RNG seeded right before it) and backward; (outputs, grads, input grad)."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    patch = (functorch_config.patch(activation_memory_budget=budget) if budget is not None
             else contextlib.nullcontext())
    with patch:
        torch.manual_seed(seed)
        outputs = call(x)
        _loss(outputs, seed).backward()
    grads = {name: None if p.grad is None else p.grad.detach().clone()
             for name, p in module.named_parameters()}
    return tuple(o.detach().clone() for o in outputs), grads, x.grad


def _assert_same(got, want, what: str) -> None:
    if want is None or got is None:
        assert got is None and want is None, f"{what}: {got!r} vs eager {want!r}"
        return
    torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{what}: {m}")


def _assert_matches_eager(program: Program, compile_fn, seed: int,
                          budget: float | None = None, iterations: int = 2) -> None:
    torch.manual_seed(seed)
    module = ProgramModule(program)
    eager = copy.deepcopy(module)
    x = torch.randn(program.input_shape, dtype=DTYPE)
    compiled = compile_fn(module)
    for it in range(iterations):
        run_seed = seed * 7 + it
        want_out, want_grads, want_x = _run(eager, eager, x, run_seed)
        got_out, got_grads, got_x = _run(compiled, module, x, run_seed, budget)
        assert len(got_out) == len(want_out)
        for k, (got, want) in enumerate(zip(got_out, want_out)):
            _assert_same(got, want, f"iteration {it}: output {k} (v{program.outputs[k]})")
        for name, want in want_grads.items():
            _assert_same(got_grads[name], want, f"iteration {it}: grad of {name}")
        _assert_same(got_x, want_x, f"iteration {it}: grad of the input")
        want_buffers = dict(eager.named_buffers())
        got_buffers = dict(module.named_buffers())
        assert got_buffers.keys() == want_buffers.keys()
        for name, want in want_buffers.items():
            _assert_same(got_buffers[name], want, f"iteration {it}: buffer {name}")


# ---- the properties ----------------------------------------------------------------------------

SEEDS = st.integers(0, 2**16)


@PROFILE
@given(program=programs(), seed=SEEDS)
def test_aot_module_min_cut_matches_eager_at_every_budget(program, seed):
    for budget in BUDGETS:
        try:
            _assert_matches_eager(program, _aot_min_cut, seed, budget=budget)
        except Exception:
            note(f"failed at activation_memory_budget={budget}")
            raise


@COMPILE_PROFILE
@given(program=programs(), seed=SEEDS, budget=st.sampled_from(BUDGETS))
def test_torch_compile_aot_pipeline_matches_eager(program, seed, budget):
    import aot_pipeline  # noqa: F401  (the back end is registered by its entry point)

    torch._dynamo.reset()
    try:
        _assert_matches_eager(program, lambda module: torch.compile(
            module, backend="aot_pipeline",
            options={"memory_budget": budget, "compiler": "nop"}), seed)
    finally:
        torch._dynamo.reset()


def test_programs_cover_every_step_kind():
    """The generator can draw every kind of step (a guard against a silently narrowed one)."""
    seen: set[str] = set()

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(program=programs())
    def collect(program):
        seen.update(step.op for step in program.steps)

    collect()
    assert seen == {"unary", "linear", "matmul", "binary", "reduce", "view", "reshape",
                    "transpose", "slice", "dropout", "batchnorm"}


@pytest.mark.parametrize("budget", BUDGETS)
def test_a_fixed_deterministic_program_matches_eager(budget):
    """One hand-written program (every step kind but dropout) at every budget: a quick check
    that the harness itself is sound, independent of what hypothesis draws."""
    steps = (
        Step("linear", (0,), (8, 6)),           # v1 (4, 6)
        Step("unary", (1,), ("gelu",)),         # v2
        Step("batchnorm", (2,), (6,)),          # v3
        Step("matmul", (3, 2), (True,)),        # v4 (4, 4)
        Step("reduce", (4,), ("amax", 1, "sub")),  # v5
        Step("unary", (5,), ("exp",)),          # v6
        Step("binary", (6, 4), ("mul",)),       # v7
        Step("transpose", (7,)),                # v8 (4, 4)
        Step("slice", (8,), (1, 0, 4, 2)),      # v9 (4, 2)
        Step("reshape", (9,), (2, 4)),          # v10
        Step("view", (3,), (6, 4)),             # v11
    )
    program = Program((4, 8), steps, (10, 11))
    _assert_matches_eager(program, _aot_min_cut, 0, budget=budget)
