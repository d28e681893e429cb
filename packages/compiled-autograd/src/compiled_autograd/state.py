"""Process-wide state of the switch: counters and what the C++ graph cache holds."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class EngineState:
    captures: int = 0  # begin_capture calls (C++ cache misses)
    compiles: int = 0  # graphs handed to a compiler_fn
    runs: int = 0  # compiled graphs executed (hits and misses)
    in_compiled_region: bool = False  # a compiled backward graph is running now
    depth: int = 0  # nesting of enable()
    # The compiler whose graphs fill the C++ cache (the cache ignores compilers); compared with
    # engine.same_compiler, never by ==.
    cache_owner: Any = None
    move_cpu_scalars: bool | None = None  # None: follow Inductor's cudagraphs setting

    def cpu_scalars_to_cuda(self) -> bool:
        if self.move_cpu_scalars is not None:
            return self.move_cpu_scalars
        config = sys.modules.get("torch._inductor.config")  # never import Inductor just for this
        return bool(config is not None and config.triton.cudagraphs)


STATE = EngineState()


class CompilerFactory(functools.partial):
    """``AutogradCompilerInstance(compiler_fn)``: its type tells our factory from torch's."""

    @property
    def compiler_fn(self) -> Callable[..., Any]:
        return self.args[0]
