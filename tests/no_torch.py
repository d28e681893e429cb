"""Run Python code in a fresh interpreter, optionally where importing torch raises: how the
tests prove that ``aot_partition.core`` needs no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A meta path finder that refuses torch (and anything under it): an import of torch raises.
TORCH_BLOCKED = """
import sys

class RefuseTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this test (importing {name})")
        return None

sys.meta_path.insert(0, RefuseTorch())
"""


def run_python(code: str, *, block_torch: bool = False,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (dedented), with torch refused first when ``block_torch``."""
    source = (TORCH_BLOCKED if block_torch else "") + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=timeout)
