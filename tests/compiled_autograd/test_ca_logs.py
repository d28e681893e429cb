"""Our compiled-autograd logs match torch's: logger names, NodeCall annotations, engine messages.

The first five tests are torch's own compiled-autograd log tests (test/inductor/
test_compiled_autograd.py: test_logs, test_verbose_logs_graph, test_verbose_logs_cpp,
test_verbose_logs_snapshot, test_verbose_logs_aot_dispatcher_nodes) run on our engine, with
torch's way of reading the logs (``logs_to_string``: a handler on torch's artifact logger of
``torch._dynamo.compiled_autograd``, the artifact switched on with ``torch._logging.set_logs``).
Changes: graphs are run as captured (no Inductor: the logs do not depend on the compiler), the
forward of the AOT test uses ``aot_eager``, the recapture message of the C++ engine is the
2.11-2.15 one (``N changed tensor shapes``), and the snapshot test switches the artifact off
before ``enable`` (as torch wrote it, the artifact is already on at ``enable``, and torch 2.13's
own engine logs the cache miss too). The last test runs torch's compiled autograd and
ours on the same backwards in a fresh interpreter and compares the annotations line for line.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import compiled_autograd
import pytest
import torch

TORCH_CA_MODULE = "torch._dynamo.compiled_autograd"  # the logger names, never imported here


@contextlib.contextmanager
def logs_to_string(artifact: str) -> Iterator[io.StringIO]:
    """What torch's tests read: the artifact on, a handler on its logger."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    torch._logging.set_logs(**{artifact: True})
    logger = torch._logging.getArtifactLogger(TORCH_CA_MODULE, artifact)
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()


def identity_compiler(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return gm


def check_output_and_recompiles(fn, count: int = 1, **enable_kw) -> None:
    """torch's helper: the same results as eager, ``count`` captures and compiles."""
    with torch.autograd.set_multithreading_enabled(False):
        torch._dynamo.reset()
        torch.manual_seed(123)
        expected = list(fn())
        torch.manual_seed(123)
        before = compiled_autograd.counters()
        with compiled_autograd.enable(identity_compiler, **enable_kw):
            actual = list(fn())
        after = compiled_autograd.counters()
    for want, got in zip(expected, actual, strict=True):
        torch.testing.assert_close(got, want)
    assert after["captures"] - before["captures"] == count
    assert after["compiles"] - before["compiles"] == count


def mlp_backward():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                                torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn([2, 4])
    model(x).sum().backward()
    yield model[0].weight.grad
    yield model[0].bias.grad
    yield model[2].weight.grad
    yield model[2].bias.grad


def in_order(expected: list[str], text: str) -> int:
    """How many of ``expected`` appear in ``text``'s lines in that order (torch's check)."""
    found = 0
    for line in text.split("\n"):
        if found == len(expected):
            break
        if expected[found] in line:
            found += 1
    return found


def test_logs():
    with compiled_autograd.enable(identity_compiler), logs_to_string("compiled_autograd") as logs:
        torch.randn(4, 4, requires_grad=True).sum().backward()
    assert compiled_autograd.counters()["captures"] == 1
    assert compiled_autograd.counters()["compiles"] == 1
    assert "torch::autograd::AccumulateGrad (NodeCall" in logs.getvalue()
    # The engine's cache-miss messages go to the verbose artifact only.
    assert ("Cache miss due to new autograd node: torch::autograd::GraphRoot"
            not in logs.getvalue())


def test_verbose_logs_graph():
    with logs_to_string("compiled_autograd_verbose") as logs:
        check_output_and_recompiles(mlp_backward)
    expected_logs = [
        "torch::autograd::GraphRoot (NodeCall 0)",
        "ReluBackward0 (NodeCall 2)",
        "AddmmBackward0 (NodeCall 3)",
        "ReluBackward0 (NodeCall 5)",
        "TBackward0 (NodeCall 6)",
        "torch::autograd::AccumulateGrad (NodeCall 7)",
        "torch::autograd::AccumulateGrad (NodeCall 9)",
        "TBackward0 (NodeCall 10)",
        "torch::autograd::AccumulateGrad (NodeCall 11)",
        "SumBackward0 (NodeCall 1)",
        "ReluBackward0 (NodeCall 2)",
        "AddmmBackward0 (NodeCall 3)",
        "torch::autograd::AccumulateGrad (NodeCall 11)",
        "TBackward0 (NodeCall 4)",
        "torch::autograd::AccumulateGrad (NodeCall 5)",
        "ReluBackward0 (NodeCall 6)",
        "AddmmBackward0 (NodeCall 7)",
        "torch::autograd::AccumulateGrad (NodeCall 10)",
        "TBackward0 (NodeCall 8)",
        "torch::autograd::AccumulateGrad (NodeCall 9)",
        "torch::autograd::AccumulateGrad (NodeCall 11)",
    ]
    assert in_order(expected_logs, logs.getvalue()) == len(expected_logs), logs.getvalue()
    # torch's comment format, from GraphModule's printer.
    assert re.search(r"# File: .+:\d+ in set_node_origin, code: SumBackward0 \(NodeCall 1\)\n",
                     logs.getvalue())


def test_verbose_logs_cpp():
    def fn():
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                                    torch.nn.Linear(4, 4), torch.nn.ReLU())
        for i in [10, 11, 12]:
            model.zero_grad()
            x = torch.randn([i, 4])
            model(x).sum().backward()
            yield model[0].weight.grad
            yield model[0].bias.grad
            yield model[2].weight.grad
            yield model[2].bias.grad

    # Static sizes first (torch's default): the second batch size recaptures.
    with logs_to_string("compiled_autograd_verbose") as logs:
        check_output_and_recompiles(fn, count=2, dynamic=False)
    all_logs = logs.getvalue()
    first = re.findall(r".*Cache miss due to new autograd node: torch::autograd::GraphRoot "
                       r"\(NodeCall 0\) with key size (\d+), previous key sizes=\[\]\n", all_logs)
    assert len(first) == 1
    recapture = re.findall(r".*Cache miss due to (\d+) changed tensor shapes \(total of \d+\): "
                           r"sizes\[0\].*\n", all_logs)
    assert len(recapture) == 1 and int(recapture[0]) > 0


def test_verbose_logs_snapshot():
    with logs_to_string("compiled_autograd_verbose") as logs:
        torch._logging.set_logs()  # off when enable() reads it
        with compiled_autograd.enable(identity_compiler):
            # unused: the verbose level was read when enable() was entered
            torch._logging.set_logs(compiled_autograd_verbose=True)
            list(mlp_backward())
    unexpected_logs = [
        "Cache miss due to new autograd node: torch::autograd::GraphRoot (NodeCall 0)"
    ]
    assert sum(1 for e in unexpected_logs if e in logs.getvalue()) == 0


def test_verbose_logs_snapshot_on_at_enable():
    """The other side: on when enable() reads it, the engine's messages come through."""
    with logs_to_string("compiled_autograd_verbose") as logs:
        with compiled_autograd.enable(identity_compiler):
            list(mlp_backward())
    assert ("Cache miss due to new autograd node: torch::autograd::GraphRoot (NodeCall 0)"
            in logs.getvalue())


def test_verbose_logs_aot_dispatcher_nodes():
    def fn():
        @torch.compile(backend="aot_eager")
        def f(x):
            tmp1 = x.sin()
            tmp2 = x.cos()
            torch._dynamo.graph_break()
            return tmp1.sin() + tmp2.cos()

        x = torch.randn(4, requires_grad=True)
        out = f(x)
        out.sum().backward()
        yield x.grad

    with mock.patch("torch._functorch.aot_autograd.AOT_COUNTER", new_callable=itertools.count), \
            logs_to_string("compiled_autograd_verbose") as logs:
        check_output_and_recompiles(fn)
    expected_logs = [
        "CompiledFunctionBackward1",
        "aot1_tangents_1",
        "aot1_sin_1",
        "aot1_primals_2",
        "aot1_neg",
        "aot0_tangents_2",
        "aot1_cos_1",
        "aot1_primals_1",
        "aot0_tangents_1",
        "CompiledFunctionBackward0",
        "aot0_neg",
        "aot0_sin",
        "aot0_mul",
        "aot0_mul_1",
        "aot0_cos",
        "aot0_add",
    ]
    assert sum(1 for e in expected_logs if e in logs.getvalue()) == len(expected_logs)
    assert "code: CompiledFunctionBackward1 (NodeCall 2)" in logs.getvalue()


def test_nothing_on_torchs_loggers_when_off():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    torch._logging.set_logs()
    loggers = [torch._logging.getArtifactLogger(TORCH_CA_MODULE, name)
               for name in ("compiled_autograd", "compiled_autograd_verbose")]
    handler = Keep()
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with compiled_autograd.enable(identity_compiler):
            list(mlp_backward())
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert compiled_autograd.counters()["captures"] == 1
    assert records == []


# Torch's engine and ours on the same backwards; what the logs say about each, as JSON.
SIDE_BY_SIDE = textwrap.dedent("""
    import io, itertools, json, logging, re
    from unittest import mock
    import torch
    import compiled_autograd as ca
    from torch._dynamo import compiled_autograd as torch_ca

    def verbose_log(run):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        torch._logging.set_logs(compiled_autograd_verbose=True)
        logger = torch._logging.getArtifactLogger("torch._dynamo.compiled_autograd",
                                                  "compiled_autograd_verbose")
        logger.addHandler(handler)
        try:
            run()
        finally:
            logger.removeHandler(handler)
            torch._logging.set_logs()
        return stream.getvalue()

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                                   torch.nn.Linear(4, 4), torch.nn.ReLU())

    def one_backward(enable):
        with enable(lambda gm: gm):
            mlp()(torch.randn(2, 4)).sum().backward()

    def new_shapes(enable):
        model = mlp()
        with enable(lambda gm: gm, dynamic=False):
            for i in [10, 11, 12]:
                model.zero_grad()
                model(torch.randn(i, 4)).sum().backward()

    def aot_backwards(enable):
        torch._dynamo.reset()
        @torch.compile(backend="aot_eager")
        def f(x):
            tmp1, tmp2 = x.sin(), x.cos()
            torch._dynamo.graph_break()
            return tmp1.sin() + tmp2.cos()
        with mock.patch("torch._functorch.aot_autograd.AOT_COUNTER",
                        new_callable=itertools.count):
            out = f(torch.randn(4, requires_grad=True))
        with enable(lambda gm: gm):
            out.sum().backward()

    result = {}
    with torch.autograd.set_multithreading_enabled(False):
        for scenario in (one_backward, new_shapes, aot_backwards):
            for engine, enable in (("torch", torch_ca._enable), ("ours", ca.enable)):
                ca.reset()  # the documented hand-over between the two engines
                torch_ca.reset()
                text = verbose_log(lambda: scenario(enable))
                result[f"{scenario.__name__}/{engine}"] = {
                    "origins": re.findall(r"code: (.+ \\(NodeCall \\d+\\))", text),
                    "misses": [line for line in text.splitlines() if "Cache miss" in line],
                    "aot_nodes": re.findall(r"\\b(aot\\d+_\\w+) = ", text),
                    # the line, not the count: what each DCE removes differs on torch 2.11
                    "dce": len(re.findall(r"DCE removed \\d+ nodes", text)),
                }
    print(json.dumps(result))
""")


@pytest.mark.slow  # a fresh interpreter: ~20 s on 2 shared cores
def test_same_lines_as_torchs_compiled_autograd():
    """Both engines in one fresh process (they share process-global engine state): every
    NodeCall annotation in graph order, every engine message, every pasted AOT node name and
    the DCE lines are the same, on each of three backwards."""
    out = subprocess.run([sys.executable, "-c", SIDE_BY_SIDE], check=True, capture_output=True,
                         text=True, timeout=300, cwd=Path(__file__).parent)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for scenario in ("one_backward", "new_shapes", "aot_backwards"):
        theirs, ours = result[f"{scenario}/torch"], result[f"{scenario}/ours"]
        assert theirs["origins"], scenario  # the comparison compares something
        assert ours == theirs, scenario
    assert len(result["new_shapes/ours"]["misses"]) == 2
    assert result["aot_backwards/ours"]["aot_nodes"]
