"""Real ranks for distributed tests: N processes over gloo on this machine, each under a timeout.

``run_ranks("module:function", world_size=2, kwargs={...})`` starts ``world_size`` Python
processes (fresh interpreters, as ``torchrun`` would), sets the usual ``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` / ``MASTER_PORT`` variables, initializes the default process group (gloo, on
loopback), calls ``function(**kwargs)`` in each and returns the ranks' return values in rank
order. The function must live in an importable module (``tests/`` is on the path) and return
something picklable.

A rank that raises fails the call with that rank's traceback; a hang (a collective that one rank
never joins) kills every rank once ``timeout`` seconds have passed and fails with their output, so
a deadlock fails the test instead of blocking CI. Before killing them it asks each rank for every
thread's stack (faulthandler on SIGUSR1), which the failure shows with the rank's output.

The timeout measures the ranks' work, not the machine: its clock starts once every rank is ready,
by default when each has imported the target's module (torch with it) and joined the process
group; with ``ready="marked"`` when each has called ``mark_ready()`` (where the timed part
starts). Starting is bounded only by ``start_timeout``, a guard against a rank that never starts.
A target that calls ``report_progress(count)`` can be judged by its state: ``stall_timeout``
fails the run ("made no progress") once no rank's count has changed for that long, which tells
a deadlock from a slow machine.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent
# The folder of one run, where ranks leave their ready marks and progress counts.
RUN_DIR_ENV = "AOT_RANKS_RUN_DIR"
READY_MODES = ("started", "marked")
_POLL_S = 0.05

_WORKER = """
import faulthandler, os, pickle, signal, sys, traceback
import importlib
import torch.distributed as dist

# run_ranks sends SIGUSR1 to a rank that outlives the timeout: every thread's stack goes to the
# log, so a hang fails naming where each rank waits.
faulthandler.register(signal.SIGUSR1, all_threads=True)

result_path = sys.argv[1]
with open(sys.argv[2], "rb") as f:
    target, kwargs, mark_when_started = pickle.load(f)
module_name, function_name = target.split(":")
try:
    function = getattr(importlib.import_module(module_name), function_name)
    dist.init_process_group("gloo")
    if mark_when_started:  # imported and joined: run_ranks' clock starts when all are here
        from ranks import mark_ready
        mark_ready()
    outcome = ("ok", function(**kwargs))
except BaseException:
    outcome = ("error", traceback.format_exc())
with open(result_path, "wb") as f:
    pickle.dump(outcome, f)
try:
    dist.destroy_process_group()
except Exception:
    pass
# A failing rank may leave peers blocked in a collective: exit now rather than wait for them.
os._exit(0)
"""


class RanksFailed(AssertionError):
    """A rank raised, exited abnormally, did not start, did not finish in time or stalled."""


def mark_ready() -> None:
    """On a rank: its timed part starts here (``run_ranks(..., ready="marked")``)."""
    Path(os.environ[RUN_DIR_ENV], f"ready{os.environ['RANK']}").touch()


_progress: mmap.mmap | None = None


def report_progress(count: int) -> None:
    """On a rank: how far its work has come (``run_ranks(..., stall_timeout=)`` watches it).
    One store into a shared page: cheap enough to call every iteration."""
    global _progress
    if _progress is None:
        path = Path(os.environ[RUN_DIR_ENV], f"progress{os.environ['RANK']}")
        path.write_bytes(bytes(8))
        with open(path, "r+b") as f:
            _progress = mmap.mmap(f.fileno(), 8)
    struct.pack_into("<q", _progress, 0, count)


def _progress_of(run_dir: Path, world_size: int) -> list[int]:
    counts = []
    for rank in range(world_size):
        try:
            counts.append(struct.unpack("<q", Path(run_dir, f"progress{rank}").read_bytes())[0])
        except (FileNotFoundError, struct.error):
            counts.append(0)
    return counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(target: str, world_size: int = 2, kwargs: dict[str, Any] | None = None,
              timeout: float = 240.0, env: dict[str, str] | None = None, *,
              ready: str = "started", stall_timeout: float | None = None,
              start_timeout: float = 600.0) -> list[Any]:
    """Run ``target`` ("module:function") on ``world_size`` gloo ranks; their results in rank
    order. ``timeout``: seconds from the moment every rank is ready (``ready``: "started",
    imported and joined; "marked", called ``mark_ready()``) to the end. ``stall_timeout``:
    seconds without any rank's ``report_progress`` count changing, once all are ready.
    ``start_timeout``: seconds for every rank to be ready."""
    if ready not in READY_MODES:
        raise ValueError(f"ready must be one of {', '.join(READY_MODES)}; got {ready!r}")
    with tempfile.TemporaryDirectory(prefix="aot-ranks-") as tmp:
        spec = Path(tmp, "spec.pkl")
        spec.write_bytes(pickle.dumps((target, kwargs or {}, ready == "started")))
        port = _free_port()
        base_env = {**os.environ, **(env or {}), RUN_DIR_ENV: tmp}
        base_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS_DIR), base_env.get("PYTHONPATH", "")) if p)
        base_env.setdefault("OMP_NUM_THREADS", "1")
        procs, logs, results = [], [], []
        for rank in range(world_size):
            rank_env = {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            log = open(Path(tmp, f"rank{rank}.log"), "w+b")  # noqa: SIM115 (closed below)
            result = Path(tmp, f"rank{rank}.pkl")
            procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, str(result), str(spec)],
                                          env=rank_env, stdout=log, stderr=subprocess.STDOUT))
            logs.append(log)
            results.append(result)
        try:
            failure = _watch(procs, Path(tmp), timeout=timeout, stall_timeout=stall_timeout,
                             start_timeout=start_timeout, ready=ready)
            if failure is not None:
                _dump_stacks(procs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            # a hung rank's log ends with its threads' stacks: keep enough of it for them
            outputs.append(log.read().decode(errors="replace")[-(12000 if failure else 6000):])
            log.close()
        if failure is not None:
            raised = "".join(f"rank {rank} raised:\n{value}\n"
                             for rank, (status, value) in enumerate(map(_outcome, results))
                             if status == "error")
            raise RanksFailed(f"{target} on {world_size} ranks {failure}:\n{raised}"
                              + _joined(outputs))
        values = []
        for rank, (proc, result) in enumerate(zip(procs, results)):
            if not result.exists():
                raise RanksFailed(f"rank {rank} of {target} exited with {proc.returncode} and no "
                                  f"result:\n" + _joined(outputs))
            status, value = pickle.loads(result.read_bytes())
            if status == "error":
                raise RanksFailed(f"rank {rank} of {target} raised:\n{value}\n" + _joined(outputs))
            values.append(value)
        return values


def _watch(procs: list[subprocess.Popen[bytes]], run_dir: Path, *, timeout: float,
           stall_timeout: float | None, start_timeout: float, ready: str) -> str | None:
    """Wait for every rank to exit; why they were stopped instead (None: they all exited)."""
    world_size = len(procs)
    ready_marks = [Path(run_dir, f"ready{rank}") for rank in range(world_size)]
    started = time.monotonic()
    deadline: float | None = None   # set once every rank is ready
    counts: list[int] = []
    last_change = 0.0
    while any(proc.poll() is None for proc in procs):
        now = time.monotonic()
        if deadline is None:
            gone = [rank for rank, proc in enumerate(procs)
                    if proc.poll() is not None and not ready_marks[rank].exists()]
            if gone:  # the others would wait for it to join: no point waiting with them
                return f"did not start: rank {gone[0]} exited before it was ready"
            if all(mark.exists() for mark in ready_marks):
                deadline, last_change = now + max(1.0, timeout), now
                counts = _progress_of(run_dir, world_size)
            elif now - started > start_timeout:
                what = ("imported and joined the process group" if ready == "started"
                        else "called mark_ready()")
                return (f"did not start in {start_timeout:.0f} s (not every rank {what}; "
                        f"ready: {[mark.exists() for mark in ready_marks]})")
        else:
            if now > deadline:
                return (f"did not finish in {timeout:.0f} s from when every rank was ready "
                        "(a hang or a deadlock)")
            if stall_timeout is not None:
                now_counts = _progress_of(run_dir, world_size)
                if now_counts != counts:
                    counts, last_change = now_counts, now
                elif now - last_change > stall_timeout:
                    return (f"made no progress in {stall_timeout:.0f} s (a deadlock: every "
                            f"rank's count stayed at {counts})")
        time.sleep(_POLL_S)
    return None


def _outcome(result: Path) -> tuple[str, Any]:
    """A rank's ("ok", value) or ("error", traceback); ("none", None) if it left none."""
    return pickle.loads(result.read_bytes()) if result.exists() else ("none", None)


def _dump_stacks(procs: list[subprocess.Popen[bytes]]) -> None:
    """Ask every rank still running for its threads' stacks (faulthandler, into its log)."""
    alive = [proc for proc in procs if proc.poll() is None]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
    time.sleep(2.0)  # faulthandler writes from the signal handler; give it a moment


def _joined(outputs: list[str]) -> str:
    return "\n".join(f"--- rank {rank} output ---\n{text}" for rank, text in enumerate(outputs))
