"""Ours and torch's own compiled autograd in one process do not break each other.

Torch replaying a graph we cached is refused with ForeignCompilerError (fixed by reset()).

The C++ engine binds each node type's functional backward once per process, into whichever
compiler is active, and its graph cache ignores which compiler filled it. Both facts are
process-global, so each scenario runs in a fresh interpreter. The scenario runs under every
torch of the supported range: `.ci/torch_range` runs this file under torch 2.11 and 2.15.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = textwrap.dedent("""
    import json, torch
    import compiled_autograd as ca
    from torch._dynamo import compiled_autograd as torch_ca

    def net(kind):
        torch.manual_seed(0)
        act = torch.nn.Tanh() if kind == "tanh" else torch.nn.Sigmoid()
        return torch.nn.Sequential(torch.nn.Linear(4, 4), act, torch.nn.Linear(4, 1))

    def grads(model, x, ctx):
        model.zero_grad()
        with ctx:
            (model(x) * 3).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    x = torch.randn(5, 4)
    result = {}
    seen = []
    ours = lambda gm: seen.append("ours") or gm
    theirs = lambda gm: seen.append("torch") or gm
    m = net("tanh")
    want = grads(m, x, torch.enable_grad())
    # 1. torch's compiled autograd binds TanhBackward0, MulBackward0, ... first
    got_torch = grads(m, x, torch_ca._enable(theirs))
    # 2. ours must find those bindings, and must not replay torch's cached graph
    got_ours = grads(m, x, ca.enable(ours))
    # 3. ours binds SigmoidBackward0 first; torch's must still find it afterwards
    s = net("sigmoid")
    want_s = grads(s, x, torch.enable_grad())
    got_s_ours = grads(s, x, ca.enable(ours))
    # 4. torch's compiled autograd would replay our cached graph: refused, loudly
    try:
        grads(s, x, torch_ca._enable(theirs))
        refused = ""
    except ca.ForeignCompilerError as error:
        refused = str(error)
    ca.reset()  # the documented way to hand the engine to torch's compiled autograd
    got_s_torch = grads(s, x, torch_ca._enable(theirs))
    close = lambda a, b: all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a, b))
    result = dict(torch_ok=close(got_torch, want), ours_ok=close(got_ours, want),
                  sigmoid_ours_ok=close(got_s_ours, want_s),
                  sigmoid_torch_ok=close(got_s_torch, want_s), seen=seen, refused=refused)
    print("RESULT" + json.dumps(result))
""")


def _run(python: str, extra_path: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(extra_path + [env.get("PYTHONPATH", "")])
    proc = subprocess.run([python, "-c", SCENARIO], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _check(result: dict) -> None:
    assert result["torch_ok"] and result["ours_ok"], result
    assert result["sigmoid_ours_ok"] and result["sigmoid_torch_ok"], result
    assert result["seen"] == ["torch", "ours", "ours", "torch"], result
    assert "Call compiled_autograd.reset() before switching" in result["refused"], result


def test_torch_then_ours_then_torch_in_one_process():
    _check(_run(sys.executable, []))
