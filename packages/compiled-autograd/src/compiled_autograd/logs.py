"""Compiled-autograd logs under torch's logger names and in torch's format.

torch logs its compiled autograd through two artifact loggers of the module
``torch._dynamo.compiled_autograd``: ``compiled_autograd`` (each captured graph, at INFO) and
``compiled_autograd_verbose`` (DEBUG: the graph, DCE counts, and the C++ engine's own
messages: cache misses and why, each autograd node named with its ``NodeCall`` number). We log
to the same two loggers (by name: that module is never imported), in the same format, so
``TORCH_LOGS=compiled_autograd`` / ``compiled_autograd_verbose``, torch's log-capturing tests
and tools that read these lines work with our engine too.

Each graph node is tagged with the autograd node it came from, as torch does: a one-frame stack
trace whose code line is ``<node name>[<aot id>] (NodeCall <i>)``, which ``GraphModule``'s
printer shows as ``# File: ...capture.py:<line> in set_node_origin, code: ReluBackward0
(NodeCall 2)``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch._logging import getArtifactLogger
from torch.fx._utils import lazy_format_graph_code
from torch.fx.traceback import set_stack_trace

__all__ = ["TORCH_LOGGER_MODULE", "compiled_autograd_log", "log_graph", "set_node_origin",
           "verbose_enabled", "verbose_log"]

TORCH_LOGGER_MODULE = "torch._dynamo.compiled_autograd"
compiled_autograd_log = getArtifactLogger(TORCH_LOGGER_MODULE, "compiled_autograd")
verbose_log = getArtifactLogger(TORCH_LOGGER_MODULE, "compiled_autograd_verbose")


def verbose_enabled() -> bool:
    """Whether the ``compiled_autograd_verbose`` artifact is on now (``TORCH_LOGS`` or
    ``torch._logging.set_logs``); torch reads it once per ``enable``, and so do we."""
    return bool(torch._logging._internal.log_state.is_artifact_enabled(
        "compiled_autograd_verbose"))


def set_node_origin(node_name: str, nodecall_index: int, aot_id: str = "") -> None:
    """Tag the graph nodes recorded next with autograd node ``node_name``: a stack trace of
    the caller's frame whose code is ``<node_name><aot_id> (NodeCall <nodecall_index>)``."""
    frame = sys._getframe(1)
    code = frame.f_code
    set_stack_trace([f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n'
                     f"    {node_name}{aot_id} (NodeCall {nodecall_index})\n"])


def log_graph(module: torch.fx.GraphModule) -> None:
    """The finished graph, as torch prints it: INFO on ``compiled_autograd``, DEBUG on
    ``compiled_autograd_verbose`` (formatted only if a logger is on)."""
    lazy_code: Any = lazy_format_graph_code("Compiled autograd graph", module,
                                            include_device=True, include_stride=True,
                                            colored=True)
    compiled_autograd_log.info("%s", lazy_code)
    verbose_log.debug("%s", lazy_code)
