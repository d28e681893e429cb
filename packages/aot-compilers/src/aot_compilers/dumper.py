"""Graph dumping and reproduction: ``graph_dumper_aot``, ``get_inputs`` and ``debug_compile``.

A dump is a folder written by ``fx.GraphModule.to_folder`` (``module.py`` with class
``FxModule``, ``__init__.py``, ``state_dict.pt``) plus ``<name>.input``: a pickled list with one
entry per graph input, ``(type, shape, stride, dtype, device)`` for tensors and ``(type,)`` for
python ints, floats and bools. With ``dump_example_input`` the inputs themselves go to
``<name>.pt``. Each folder is written under a temporary name and renamed into place, so a failed
dump leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import pickle
import random
import re
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from .errors import GraphDumpError

log = logging.getLogger(__name__)

InputMeta = tuple[Any, ...]
_MARKER = ".aot_compilers_dump"  # only folders carrying it may be replaced by a new dump
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- input metadata ------------------------------------------------------------------------
def _concrete(value: int | torch.SymInt, what: str) -> int:
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        if hint is None:
            raise GraphDumpError(f"{what} is data-dependent ({value}); it has no example value "
                                 f"to record in the .input metadata")
        return int(hint)
    return int(value)


def _flatten_args(args: Any) -> list[Any]:
    # Joint graphs get [primals, tangents]; the dumped joint module takes them flat.
    if isinstance(args, (list, tuple)):
        return [leaf for arg in args for leaf in _flatten_args(arg)]
    return [args]


def input_meta(args: Sequence[Any]) -> list[InputMeta]:
    """The ``.input`` metadata of ``args`` (nested lists, as joint graphs get, are flattened)."""
    metas: list[InputMeta] = []
    for index, arg in enumerate(_flatten_args(args)):
        if isinstance(arg, torch.Tensor):
            shape = torch.Size(_concrete(s, f"input {index} size") for s in arg.shape)
            stride = tuple(_concrete(s, f"input {index} stride") for s in arg.stride())
            metas.append((torch.Tensor, shape, stride, arg.dtype, arg.device))
        elif isinstance(arg, (bool, int, float)):
            metas.append((type(arg),))
        elif isinstance(arg, torch.SymInt):
            metas.append((int,))
        elif isinstance(arg, torch.SymFloat):
            metas.append((float,))
        else:
            raise GraphDumpError(
                f"input {index} is a {type(arg).__name__}; graph dumps can record tensors, ints, "
                f"floats and bools only")
    return metas


def _random_tensor(shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                   device: torch.device | str) -> torch.Tensor:
    out = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)
    if dtype == torch.bool:
        out.copy_(torch.randint(0, 2, out.shape, device=device).bool())
    elif not (dtype.is_floating_point or dtype.is_complex):
        out.zero_()  # integer inputs are often indices: zero is valid for any indexed size
    else:
        out.copy_(torch.rand(out.shape, dtype=dtype, device=device))
    return out


def get_inputs(input_data_path: str | os.PathLike[str],
               device: torch.device | str | None = None) -> list[Any]:
    """Random inputs matching the metadata in a ``.input`` file (as written by the dumper).

    Tensors keep their recorded shape, stride and dtype: floating and complex tensors are
    uniform in [0, 1), bool tensors random, integer tensors zero (safe as indices). Python
    scalars become a random float in [0, 1), a random int in [1, 8] or a random bool. ``device``
    overrides the recorded device (e.g. to replay a CUDA dump on CPU).
    """
    path = Path(input_data_path)
    try:
        with path.open("rb") as f:
            metas = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as error:
        raise GraphDumpError(f"cannot read input metadata {path}: {error}") from error
    if not isinstance(metas, list):
        raise GraphDumpError(f"{path} holds a {type(metas).__name__}, expected a list of input "
                             f"metadata tuples")
    inputs: list[Any] = []
    for index, meta in enumerate(metas):
        if isinstance(meta, tuple) and len(meta) == 1:
            kind = meta[0]
            if kind is bool:
                inputs.append(random.random() < 0.5)
            elif kind is int:
                inputs.append(random.randint(1, 8))
            elif kind is float:
                inputs.append(random.random())
            else:
                raise GraphDumpError(f"{path}: input {index} has scalar type {kind!r}; expected "
                                     f"int, float or bool")
        elif isinstance(meta, tuple) and len(meta) == 5:
            _, shape, stride, dtype, recorded_device = meta
            inputs.append(_random_tensor(shape, stride, dtype,
                                         recorded_device if device is None else device))
        else:
            raise GraphDumpError(f"{path}: input {index} metadata {meta!r} is neither (type,) "
                                 f"nor (type, shape, stride, dtype, device)")
    return inputs


# -- atomic folder writes ------------------------------------------------------------------
def _make_root(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GraphDumpError(f"cannot create dump folder {root}: {error}") from error


@contextlib.contextmanager
def _atomic_folder(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it to ``final`` only if the body succeeds."""
    _make_root(final.parent)
    if final.exists() and not (final / _MARKER).exists():
        raise GraphDumpError(f"{final} exists and is not a graph dump; refusing to replace it")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    except OSError as error:
        raise GraphDumpError(f"cannot write into dump folder {final.parent}: {error}") from error
    try:
        yield tmp
        (tmp / _MARKER).touch()
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old",
                                        dir=final.parent))
            os.replace(final, old / final.name)
            try:
                os.replace(tmp, final)
            except OSError:
                os.replace(old / final.name, final)  # put the previous dump back
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except GraphDumpError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GraphDumpError(f"writing graph dump {final} failed, nothing written: "
                             f"{type(error).__name__}: {error}") from error


def _write_module(gm: fx.GraphModule, folder: Path) -> None:
    """``gm.to_folder(folder)`` whose module finds its files relative to itself.

    ``to_folder`` hard-codes the folder path into ``module.py``; the dump is renamed after
    writing (and may be moved later), so those paths are rewritten relative to ``__file__``.
    """
    gm = copy.deepcopy(gm)
    gm.graph.set_codegen(fx.graph.CodeGen())  # plain positional inputs, no pytree codegen
    gm.recompile()
    gm.to_folder(folder, module_name="FxModule")
    module_file = folder / "module.py"
    code = module_file.read_text()
    code = code.replace(f"r'{folder}/", "_HERE + r'/")
    header = "import os\n_HERE = os.path.dirname(os.path.abspath(__file__))\n"
    module_file.write_text(header + code)


def write_graph_folder(gm: fx.GraphModule, args: Sequence[Any], final: Path,
                       dump_example_input: bool = False) -> Path:
    """Atomically write ``gm`` and ``<name>.input`` into folder ``final``.

    With ``dump_example_input`` and real (not fake) ``args``, ``<name>.pt`` is written too.
    """
    metas = input_meta(args)  # before touching the disk: bad inputs write nothing
    with _atomic_folder(final) as tmp:
        _write_module(gm, tmp)
        with (tmp / f"{final.name}.input").open("wb") as f:
            pickle.dump(metas, f)
        if dump_example_input and not _has_fake(args):
            _save_tensors(args, tmp / f"{final.name}.pt")
    log.info("wrote graph dump %s", final)
    return final


def _has_fake(args: Sequence[Any]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(a, FakeTensor) for a in _flatten_args(args))


def _save_tensors(args: Sequence[Any], path: Path) -> None:
    """``torch.save`` the flat inputs to ``path`` through a temporary file and a rename."""
    flat = [a.detach() if isinstance(a, torch.Tensor) else a for a in _flatten_args(args)]
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.save(flat, tmp)
        os.replace(tmp, path)
    except Exception:
        tmp.unlink(missing_ok=True)
        raise


def _saving_first_inputs(gm: fx.GraphModule, pt_file: Path) -> Callable[[list[Any]], Any]:
    """A boxed runner of ``gm`` that saves the real inputs of its first call to ``pt_file``.

    Compilers see fake tensors only; the real example inputs exist when the graph first runs.
    """
    pending = [True]

    def run(args: list[Any]) -> Any:
        if pending[0] and pt_file.parent.is_dir():
            pending[0] = False
            _save_tensors(args, pt_file)
        return gm(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


# -- the dumper ----------------------------------------------------------------------------
class GraphDumper:
    """A ``torch.compile`` back end that writes each graph's forward, backward and joint graphs.

    Graph ``i`` (counted per dumper, from 0, one per call) goes to
    ``{folder_name}/{current_name}/{current_name}_{forward|backward|joint}_{i}/``. The graphs
    then run unchanged (partitioned by ``aot_partition.default_partition``).
    """

    def __init__(self, current_name: str, folder_name: str | os.PathLike[str],
                 dump_example_input: bool = False) -> None:
        if not isinstance(current_name, str) or not _IDENTIFIER.match(current_name):
            raise ValueError(f"current_name must be a Python identifier (it names importable "
                             f"folders), got {current_name!r}")
        self.current_name = current_name
        self.root = Path(folder_name) / current_name
        self.dump_example_input = dump_example_input
        self.graph_index = 0

    def folder_for(self, kind: str, index: int) -> Path:
        return self.root / f"{self.current_name}_{kind}_{index}"

    def _save(self, gm: fx.GraphModule, args: Sequence[Any], kind: str, index: int
              ) -> Callable[..., Any]:
        """Dump ``gm``; return what should run it (saving real inputs on first run if asked)."""
        if not any(True for _ in gm.graph.nodes):
            log.warning("no nodes in graph %s_%s_%d; nothing dumped", self.current_name, kind,
                        index)
            return gm
        folder = write_graph_folder(gm, args, self.folder_for(kind, index),
                                    self.dump_example_input)
        if self.dump_example_input and _has_fake(args):
            return _saving_first_inputs(gm, folder / f"{folder.name}.pt")
        return gm

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from aot_partition import default_partition
        from torch._functorch.aot_autograd import aot_module_simplified

        from .fusion import default_decompositions

        index = self.graph_index
        self.graph_index += 1

        def save_forward(fw: fx.GraphModule, args: Sequence[Any]) -> Callable[..., Any]:
            return self._save(fw, args, "forward", index)

        def save_backward(bw: fx.GraphModule, args: Sequence[Any]) -> Callable[..., Any]:
            return self._save(bw, args, "backward", index)

        def save_joint(joint: fx.GraphModule, joint_args: Sequence[Any], **kwargs: Any
                       ) -> tuple[fx.GraphModule, fx.GraphModule]:
            # The joint graph never runs, so with fake joint_args it gets no .pt file.
            self._save(joint, joint_args, "joint", index)
            return default_partition(joint, joint_args, **kwargs)

        return aot_module_simplified(gm, example_inputs, fw_compiler=save_forward,
                                     bw_compiler=save_backward, partition_fn=save_joint,
                                     decompositions=default_decompositions)


def graph_dumper_aot(current_name: str, folder_name: str | os.PathLike[str],
                     dump_example_input: bool = False) -> GraphDumper:
    """A back end dumping forward, backward and joint graphs; use as
    ``torch.compile(model, backend=graph_dumper_aot("model", "dumps"))``."""
    return GraphDumper(current_name, folder_name, dump_example_input)


# -- debug_compile -------------------------------------------------------------------------
_REPRO_SCRIPT = '''\
"""Reproduce a graph saved by aot_compilers.debug_compile: python {script}"""
import importlib.util
import os

import torch
from aot_compilers import get_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("fx_repro_module", os.path.join(HERE, "module.py"))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
inputs = get_inputs(os.path.join(HERE, "{input_file}"))
outputs = module.FxModule()(*inputs)
for i, out in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
    if isinstance(out, torch.Tensor):
        print(f"output {{i}}: shape={{tuple(out.shape)}} dtype={{out.dtype}}")
'''


def debug_compile(gm: fx.GraphModule, example_inputs: Sequence[Any],
                  folder: str | os.PathLike[str] = "aot_debug_repro",
                  compiler: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Write a reproduction folder for ``gm``, print how to run it, then compile.

    The folder holds the graph module, ``repro.input`` metadata and ``repro.py``, which rebuilds
    random inputs and runs the graph. The reloaded module is run once on the real example inputs
    to prove the reproduction imports and runs. ``compiler`` (default ``ts_compile``) then
    compiles ``gm``.
    """
    from .torchscript import ts_compile

    final = Path(folder).resolve()
    metas = input_meta(example_inputs)
    with _atomic_folder(final) as tmp:
        _write_module(gm, tmp)
        with (tmp / "repro.input").open("wb") as f:
            pickle.dump(metas, f)
        (tmp / "repro.py").write_text(_REPRO_SCRIPT.format(script=final / "repro.py",
                                                           input_file="repro.input"))
    print(textwrap.dedent(f"""
        ##############################################################
        # Reproduction of the graph being compiled written to:
        #   {final}
        # Run it (random inputs rebuilt from repro.input):
        #   python {final / "repro.py"}
        # Or load it yourself:
        #   from aot_compilers import get_inputs
        #   inputs = get_inputs({str(final / "repro.input")!r})
        ##############################################################
        """))
    if not _has_fake(example_inputs):
        reloaded = _load_fx_module(final / "module.py")
        reloaded(*example_inputs)
    return (compiler or ts_compile)(gm, list(example_inputs))


def _load_fx_module(module_file: Path) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location(f"aot_repro_{abs(hash(module_file))}",
                                                  module_file)
    if spec is None or spec.loader is None:
        raise GraphDumpError(f"cannot import the reproduction module {module_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FxModule()
