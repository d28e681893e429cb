"""Exceptions raised by aot_compilers, one per kind of failure."""

from __future__ import annotations


class AotCompilersError(RuntimeError):
    """Base class for every error this package raises on purpose."""


class GraphMismatchError(AssertionError):
    """``debug_nop`` found a real value that disagrees with the node's recorded ``meta["val"]``.

    An ``AssertionError`` because it reports a broken invariant of the traced graph, as the seed's
    plain ``assert`` did; the message names the node and both values.
    """


class TorchScriptUnavailableError(AotCompilersError):
    """A TorchScript step that ``ts_compile`` needs is missing from the installed torch."""


class TorchScriptCompileError(AotCompilersError):
    """A TorchScript step failed on this graph; the message names the step."""


class GraphDumpError(AotCompilersError):
    """The graph dumper could not write (or rebuild inputs from) a dump folder."""


class UntrustedInputError(GraphDumpError):
    """A ``.input`` file asks for something a graph dump never holds (e.g. a global that would
    run code when unpickled); it was not loaded. Pass ``trusted=True`` only for trusted files."""


class MissingExtraError(ImportError):
    """An optional dependency (an ``extra``) is not installed."""
