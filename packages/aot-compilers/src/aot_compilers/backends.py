"""The compilers as ``torch.compile`` back ends, found by name through the
``torch_dynamo_backends`` entry-point group (declared in pyproject.toml)::

    torch.compile(model, backend="aot_nop")

Each is ``torch._dynamo.backends.common.aot_autograd`` with our compilers and partitioner:

* ``aot_nop``   -- graphs run unchanged; ``aot_partition.min_cut_rematerialization_partition``.
* ``aot_debug`` -- ``debug_nop`` checks every value against its traced metadata; min-cut.
* ``aot_print`` -- prints each graph's code; min-cut.
* ``aot_torchscript`` -- ``ts_compile`` (TorchScript); ``aot_partition.default_partition``, because
  recomputation gains nothing for TorchScript graphs and the plain split keeps to ops
  TorchScript handles; dynamic shapes are not supported (use ``dynamic=False``).
"""

from __future__ import annotations

from aot_partition import default_partition, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd

from .debug import debug_nop
from .torchscript import ts_compile
from .trivial import nop, print_compile

aot_nop = aot_autograd(fw_compiler=nop, bw_compiler=nop,
                       partition_fn=min_cut_rematerialization_partition)
aot_debug = aot_autograd(fw_compiler=debug_nop, bw_compiler=debug_nop,
                         partition_fn=min_cut_rematerialization_partition)
aot_print = aot_autograd(fw_compiler=print_compile, bw_compiler=print_compile,
                         partition_fn=min_cut_rematerialization_partition)
aot_torchscript = aot_autograd(fw_compiler=ts_compile, bw_compiler=ts_compile,
                      partition_fn=default_partition)

BACKENDS = {"aot_nop": aot_nop, "aot_debug": aot_debug, "aot_print": aot_print, "aot_torchscript": aot_torchscript}
