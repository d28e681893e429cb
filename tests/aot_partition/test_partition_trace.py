"""Partition decisions as TORCH_TRACE artifacts (aot_partition.report.trace), read back by tlparse."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from aot_config import functorch as functorch_config
from aot_partition import default_partition, explain_partition, partitioners
from aot_partition.report import trace
from subprocess_limits import SUBPROCESS_TIMEOUT_S
from torch._logging import _internal as torch_logging_internal
from zoo import make_case

# A fresh interpreter: TORCH_TRACE is read when torch is imported. Two compiles: the
# aot_pipeline back end at budget 0.5 (the min-cut partitioner) and default_partition.
TRACED_SCRIPT = textwrap.dedent("""
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from aot_partition import default_partition

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    compiled = torch.compile(model, backend="aot_pipeline",
                             options={"memory_budget": 0.5, "compiler": "nop"})
    compiled(torch.randn(4, 8)).sum().backward()

    nop = lambda gm, _: make_boxed_func(gm)
    backend = aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=default_partition)
    torch.compile(lambda x: (x.sin() * 2).cos(), backend=backend)(
        torch.randn(3, requires_grad=True)).sum().backward()
""")


def _tlparse() -> str:
    """The tlparse binary of this interpreter's environment (the dev group installs it)."""
    here = Path(sys.executable).parent / "tlparse"
    found = str(here) if here.exists() else shutil.which("tlparse")
    if found is None:
        pytest.fail("tlparse is not installed: it is in the workspace's dev dependency group "
                    "(uv sync)")
    return found


@pytest.fixture(scope="module")
def tlparse_pages(tmp_path_factory) -> dict[str, list[str]]:
    """Artifact name -> the texts of its pages that tlparse's index links to."""
    root = tmp_path_factory.mktemp("trace")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    env["TORCH_TRACE"] = str(root / "log")
    subprocess.run([sys.executable, "-c", TRACED_SCRIPT], env=env, cwd=root, check=True,
                   timeout=300)
    logs = list((root / "log").iterdir())
    assert len(logs) == 1, logs
    out = root / "out"
    subprocess.run([_tlparse(), str(logs[0]), "-o", str(out), "--overwrite", "--no-browser"],
                   check=True, timeout=SUBPROCESS_TIMEOUT_S, capture_output=True)
    index = (out / "index.html").read_text()
    pages: dict[str, list[str]] = {}
    for link in re.findall(r'href="([^"]+)"', index):
        match = re.fullmatch(r"[^/]+/(.+)_\d+\.(txt|json)", link)
        if match:
            pages.setdefault(match.group(1), []).append((out / link).read_text())
    return pages


def _report_of(pages: dict[str, list[str]], partitioner: str) -> str:
    reports = [p for p in pages.get("aot_partition_report", [])
               if p.startswith(f"partitioner: {partitioner}\n")]
    assert len(reports) == 1, pages.get("aot_partition_report")
    return reports[0]


@pytest.mark.slow  # shares one ~20 s traced compile in a fresh interpreter
def test_tlparse_shows_the_min_cut_decisions(tlparse_pages):
    report = _report_of(tlparse_pages, "min_cut_rematerialization_partition")
    assert "memory budget 0.5, solver " in report
    # The GELU output is saved, and why: its backward reads it unfused.
    assert re.search(r"^  gelu +aten\.gelu\.default +\d+  banned: materialized in backward",
                     report, re.M), report
    decisions = [json.loads(p) for p in tlparse_pages["aot_partition_decisions"]]
    mine = next(d for d in decisions if d["partitioner"] == "min_cut_rematerialization_partition")
    assert mine["memory_budget"] == 0.5
    by_name = {d["name"]: d for d in mine["saved"] + mine["recomputed"]}
    assert by_name["gelu"]["decision"] == "saved"
    assert by_name["gelu"]["reason"].startswith("banned: materialized in backward")


@pytest.mark.slow  # shares one ~20 s traced compile in a fresh interpreter
def test_tlparse_shows_the_flags_in_force(tlparse_pages):
    """The aot_pipeline back end patches the budget in: the page says 0.5, not the default 1.0
    (torch's own torch._functorch.config page next to it says 1.0)."""
    pages = [json.loads(p) for p in tlparse_pages["aot_config.functorch"]]
    budgets = sorted(p["activation_memory_budget"] for p in pages)
    assert budgets == [0.5, 1.0]  # the min-cut compile, then default_partition's (flags as set)
    assert all(p["ban_recompute_reductions"] is True for p in pages)
    assert "torch._functorch.config" in tlparse_pages  # torch's page, beside ours


@pytest.mark.slow  # shares one ~20 s traced compile in a fresh interpreter
def test_tlparse_shows_default_partition(tlparse_pages):
    report = _report_of(tlparse_pages, "default_partition")
    assert "solver default partition (no budget)" in report
    assert "default partition: the backward reads it" in report
    assert "recomputed:\n" in report and "aot_partition_pareto" not in tlparse_pages


@pytest.fixture
def trace_records():
    """Torch's trace logger on in this process: the artifacts written, by name."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    trace_log = torch_logging_internal.trace_log
    handler, level = Keep(), trace_log.level
    trace_log.addHandler(handler)
    trace_log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        trace_log.removeHandler(handler)
        trace_log.setLevel(level)


def _artifacts(records: list[logging.LogRecord]) -> dict[str, str]:
    out = {}
    for record in records:
        artifact = record.metadata.get("artifact")  # type: ignore[attr-defined]
        if artifact is not None:
            out[artifact["name"]] = record.payload  # type: ignore[attr-defined]
    return out


def test_pareto_page_only_when_the_partition_swept(capture, trace_records, tmp_path,
                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)  # the visualize flag writes its PNG here
    case = make_case("mlp")
    joint = capture(case.module, *case.inputs)
    trace_records.clear()  # torch's own artifacts of the capture
    explain_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs,
                      memory_budget=0.5)
    assert set(_artifacts(trace_records)) == {"aot_config.functorch", "aot_partition_report",
                                              "aot_partition_decisions"}
    trace_records.clear()
    with functorch_config.patch(visualize_memory_budget_pareto=True):
        report = explain_partition(joint.fresh(), joint.inputs,
                                   num_fwd_outputs=joint.num_fwd_outputs, memory_budget=0.5)
    page = json.loads(_artifacts(trace_records)["aot_partition_pareto"])
    assert page["png"] == report.pareto_png and (tmp_path / page["png"]).exists()
    assert [p["budget"] for p in page["points"]] == [p.budget for p in report.pareto_points]
    assert len(page["points"]) == 21


def test_nothing_is_built_without_the_trace(capture, monkeypatch):
    """No TORCH_TRACE: the report function is never called (a cost only the trace pays)."""
    # What torch's trace logger holds without TORCH_TRACE once its lazy handler has found no
    # directory (pytest's log capture adds handlers to it here).
    monkeypatch.setattr(torch_logging_internal.trace_log, "handlers", [])
    assert not trace.tracing()

    def must_not_run():
        raise AssertionError("built a trace payload without TORCH_TRACE")

    trace.trace_partition("min_cut_rematerialization_partition", must_not_run)
    monkeypatch.setattr(partitioners, "default_partition_report",
                        lambda *a, **k: must_not_run())
    joint = capture(lambda t: t.sin().cos(), torch.randn(3, requires_grad=True))
    default_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)


def test_default_partition_report_is_built_when_tracing(capture, trace_records):
    """The same call with the trace on builds it (the test above can fail)."""
    joint = capture(lambda t: t.sin().cos(), torch.randn(3, requires_grad=True))
    trace_records.clear()
    default_partition(joint.fresh(), joint.inputs, num_fwd_outputs=joint.num_fwd_outputs)
    assert set(_artifacts(trace_records)) == {"aot_config.functorch", "aot_partition_report",
                                              "aot_partition_decisions"}
    report = _artifacts(trace_records)["aot_partition_report"]
    assert report.startswith("partitioner: default_partition\n")
    assert re.search(r"^  primals_1 .* default partition: the backward reads it$", report, re.M)
