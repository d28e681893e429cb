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
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent

_WORKER = """
import faulthandler, os, pickle, signal, sys, traceback
import importlib
import torch.distributed as dist

# run_ranks sends SIGUSR1 to a rank that outlives the timeout: every thread's stack goes to the
# log, so a hang fails naming where each rank waits.
faulthandler.register(signal.SIGUSR1, all_threads=True)

result_path = sys.argv[1]
with open(sys.argv[2], "rb") as f:
    target, kwargs = pickle.load(f)
module_name, function_name = target.split(":")
dist.init_process_group("gloo")
try:
    result = getattr(importlib.import_module(module_name), function_name)(**kwargs)
    outcome = ("ok", result)
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
    """A rank raised, exited abnormally or did not finish in time."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(target: str, world_size: int = 2, kwargs: dict[str, Any] | None = None,
              timeout: float = 240.0, env: dict[str, str] | None = None) -> list[Any]:
    """Run ``target`` ("module:function") on ``world_size`` gloo ranks; their results in rank order."""
    with tempfile.TemporaryDirectory(prefix="aot-ranks-") as tmp:
        spec = Path(tmp, "spec.pkl")
        spec.write_bytes(pickle.dumps((target, kwargs or {})))
        port = _free_port()
        base_env = {**os.environ, **(env or {})}
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
        timed_out = False
        deadline = time.monotonic() + max(1.0, timeout)
        try:
            for proc in procs:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
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
            outputs.append(log.read().decode(errors="replace")[-(12000 if timed_out else 6000):])
            log.close()
        if timed_out:
            raise RanksFailed(f"{target} on {world_size} ranks did not finish in {timeout:.0f} s "
                              f"(a hang or a deadlock):\n" + _joined(outputs))
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


def _dump_stacks(procs: list[subprocess.Popen[bytes]]) -> None:
    """Ask every rank still running for its threads' stacks (faulthandler, into its log)."""
    alive = [proc for proc in procs if proc.poll() is None]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
    time.sleep(2.0)  # faulthandler writes from the signal handler; give it a moment


def _joined(outputs: list[str]) -> str:
    return "\n".join(f"--- rank {rank} output ---\n{text}" for rank, text in enumerate(outputs))
