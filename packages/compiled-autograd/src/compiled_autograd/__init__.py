"""compiled_autograd: capture the whole backward pass as one FX graph and compile it.

The Python half of PyTorch's compiled autograd, for torch 2.11 to 2.15::

    import compiled_autograd
    with compiled_autograd.enable(compiler_fn):
        loss.backward()
"""

from __future__ import annotations

from compiled_autograd.capture import AutogradCompilerInstance
from compiled_autograd.engine import (
    CompiledAutogradConflictError,
    counters,
    disable,
    enable,
    is_enabled,
    reset,
    same_compiler,
)
from compiled_autograd.finish import CompilerFnError
from compiled_autograd.from_config import (
    compile,
    flag_is_on,
    inductor_compiler,
    maybe_enable_from_config,
)
from compiled_autograd.protocol import SUPPORTED_RELEASES, UnsupportedTorchError, protocol_for
from compiled_autograd.runtime import ForeignCompilerError

__all__ = [
    "SUPPORTED_RELEASES",
    "AutogradCompilerInstance",
    "CompiledAutogradConflictError",
    "CompilerFnError",
    "ForeignCompilerError",
    "UnsupportedTorchError",
    "compile",
    "counters",
    "disable",
    "enable",
    "flag_is_on",
    "inductor_compiler",
    "is_enabled",
    "maybe_enable_from_config",
    "protocol_for",
    "reset",
    "same_compiler",
]
