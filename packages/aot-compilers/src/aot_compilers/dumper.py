"""Graph dumping and reproduction: ``graph_dumper_aot``, ``get_inputs`` and ``debug_compile``.

A dump is a folder written by ``fx.GraphModule.to_folder`` (``module.py`` with class
``FxModule``, ``__init__.py``, ``state_dict.pt``) plus ``<name>.input``: a pickled list with one
entry per graph input, ``(type, shape, stride, dtype, device)`` for tensors and ``(type,)`` for
python ints, floats and bools. With ``dump_example_input`` the inputs themselves go to
``<name>.pt``. The manifest ``.aot_compilers_dump`` (written last) names the run the folder
belongs to and lists its files.

Writing is safe against concurrent writers and killed processes (see ``dump_store``): each
folder is written under a temporary name and swapped into place under a lock, and the forward,
backward and joint graphs of one compile (one *run*) form a *group* that never mixes runs: the
first graph a run writes claims the group (other runs' graphs of that index are removed), and a
run whose group another run has claimed since writes nothing more into it. ``.input`` files are
read with a restricted unpickler (see ``input_files``).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import random
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from .dump_store import (
    DumpManifest,
    DumpScope,
    add_file,
    is_dump,
    new_run_id,
    read_manifest,
    replace_folder,
    restore_orphan,
)
from .errors import GraphDumpError
from .input_files import InputMeta, dump_input_meta, load_input_meta

log = logging.getLogger(__name__)

KINDS = ("joint", "forward", "backward")
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
               device: torch.device | str | None = None, *, trusted: bool = False) -> list[Any]:
    """Random inputs matching the metadata in a ``.input`` file (as written by the dumper).

    Tensors keep their recorded shape, stride and dtype: floating and complex tensors are
    uniform in [0, 1), bool tensors random, integer tensors zero (safe as indices). Python
    scalars become a random float in [0, 1), a random int in [1, 8] or a random bool. ``device``
    overrides the recorded device (e.g. to replay a CUDA dump on CPU).

    The file is unpickled by a restricted unpickler that only accepts what ``.input`` files hold
    (ints, floats, bools, ``torch.Tensor``, ``torch.Size``, ``torch.device``, dtypes); anything
    else raises ``UntrustedInputError``. ``trusted=True`` uses plain ``pickle.load`` instead,
    which runs whatever code the file names: only for files from a trusted source.
    """
    path = Path(input_data_path)
    if not path.exists() and restore_orphan(path.parent):
        log.warning("get_inputs: recovered %s, left half-replaced by a killed dump writer",
                    path.parent)
    metas = load_input_meta(path, trusted=trusted, _caller="get_inputs")
    inputs: list[Any] = []
    for index, meta in enumerate(metas):
        if len(meta) == 1:
            kind = meta[0]
            if kind is bool:
                inputs.append(random.random() < 0.5)
            elif kind is int:
                inputs.append(random.randint(1, 8))
            else:
                inputs.append(random.random())
            continue
        _, shape, stride, dtype, recorded_device = meta
        target = recorded_device if device is None else device
        try:
            inputs.append(_random_tensor(shape, stride, dtype, target))
        except (RuntimeError, ValueError, TypeError) as error:
            raise GraphDumpError(f"get_inputs: {path}: cannot create input {index} (shape "
                                 f"{tuple(shape)}, stride {tuple(stride)}, {dtype} on {target}): "
                                 f"{error}") from error
    return inputs


# -- writing folders -----------------------------------------------------------------------
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


def _has_fake(args: Sequence[Any]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(a, FakeTensor) for a in _flatten_args(args))


def _flat_inputs(args: Sequence[Any]) -> list[Any]:
    return [a.detach() if isinstance(a, torch.Tensor) else a for a in _flatten_args(args)]


def _graph_filler(gm: fx.GraphModule, metas: list[InputMeta], name: str,
                  example_inputs: Sequence[Any] | None) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        _write_module(gm, tmp)
        dump_input_meta(metas, tmp / f"{name}.input")
        if example_inputs is not None:
            torch.save(_flat_inputs(example_inputs), tmp / f"{name}.pt")
    return fill


def write_graph_folder(gm: fx.GraphModule, args: Sequence[Any], final: Path,
                       dump_example_input: bool = False) -> Path:
    """Write ``gm`` and ``<name>.input`` into folder ``final``, replacing an earlier dump.

    With ``dump_example_input`` and real (not fake) ``args``, ``<name>.pt`` is written too. The
    folder is written under a lock beside it and swapped into place complete; its manifest gets
    a fresh run id.
    """
    final = Path(final)
    metas = input_meta(args)  # before touching the disk: bad inputs write nothing
    real = dump_example_input and not _has_fake(args)
    scope = DumpScope.for_folder(final)
    with scope.locked():
        replace_folder(final, _graph_filler(gm, metas, final.name, args if real else None),
                       {"run_id": new_run_id()})
    log.info("wrote graph dump %s", final)
    return final


def _saving_first_inputs(gm: fx.GraphModule, save: Callable[[list[Any]], None]
                         ) -> Callable[[list[Any]], Any]:
    """A boxed runner of ``gm`` that hands the real inputs of its first call to ``save``.

    Compilers see fake tensors only; the real example inputs exist when the graph first runs.
    """
    pending = [True]

    def run(args: list[Any]) -> Any:
        if pending[0]:
            pending[0] = False
            save(args)
        return gm(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


# -- the dumper ----------------------------------------------------------------------------
@dataclass
class _Run:
    """One compile through a ``GraphDumper``: the joint, forward and backward graphs of one index
    (the backward may be compiled, and every graph first run, long after the joint is written)."""

    index: int
    run_id: str
    claimed: bool = False  # wrote its first graph: the group is (or was) this run's
    lost: bool = False  # another run claimed the group since: write nothing more into it


class GraphDumper:
    """A ``torch.compile`` back end that writes each graph's forward, backward and joint graphs.

    Graph ``i`` (counted per dumper, from 0, one per call) goes to
    ``{folder_name}/{current_name}/{current_name}_{forward|backward|joint}_{i}/``. The graphs
    then run unchanged (partitioned by ``aot_partition.default_partition``). ``run_ids[i]`` is
    the run id written into the manifests of graph ``i``'s folders (see ``read_dump``).
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
        self.run_ids: dict[int, str] = {}
        self._scope = DumpScope.for_dumper(self.root, current_name)

    def folder_for(self, kind: str, index: int) -> Path:
        return self.root / f"{self.current_name}_{kind}_{index}"

    def _start_run(self, index: int) -> _Run:
        run = _Run(index, new_run_id())
        self.run_ids[index] = run.run_id
        return run

    def _other_runs(self, run: _Run) -> dict[Path, str | None]:
        """The group's folders holding another run's dump, with that run's id."""
        others: dict[Path, str | None] = {}
        for kind in KINDS:
            folder = self.folder_for(kind, run.index)
            if is_dump(folder):
                try:
                    run_id = read_manifest(folder, verify=False).run_id
                except GraphDumpError:
                    run_id = None
                if run_id != run.run_id:
                    others[folder] = run_id
        return others

    def _lose(self, run: _Run, what: str, others: dict[Path, str | None]) -> None:
        run.lost = True
        taken = ", ".join(f"{p.name} (run {rid or 'unknown'})" for p, rid in others.items())
        log.warning("graph dump group %s_%d in %s was taken over by another dumper writing the "
                    "same name since run %s began it (%s); the %s of run %s is not dumped, so "
                    "the group keeps one run's graphs", self.current_name, run.index, self.root,
                    run.run_id, taken, what, run.run_id)

    def _save(self, gm: fx.GraphModule, args: Sequence[Any], kind: str, run: _Run
              ) -> Callable[..., Any]:
        """Dump ``gm``; return what should run it (saving real inputs on first run if asked)."""
        if not any(True for _ in gm.graph.nodes):
            log.warning("no nodes in graph %s_%s_%d; nothing dumped", self.current_name, kind,
                        run.index)
            return gm
        if run.lost:
            log.warning("%s graph of run %s not dumped: its group was taken over by another run",
                        kind, run.run_id)
            return gm
        metas = input_meta(args)  # before touching the disk: bad inputs write nothing
        final = self.folder_for(kind, run.index)
        fake = _has_fake(args)
        # Real inputs of fake-traced graphs are saved on their first run; the joint never runs.
        late = self.dump_example_input and fake and kind != "joint"
        now = self.dump_example_input and not fake
        fields = {"run_id": run.run_id, "kind": kind, "index": run.index,
                  "group": f"{self.current_name}_{run.index}"}
        with self._scope.locked():
            others = self._other_runs(run)
            if run.claimed and others:
                self._lose(run, f"{kind} graph", others)
                return gm
            # The run's first graph claims the group: other runs' graphs of this index go, the
            # one at ``final`` by being replaced, the others just before it is.
            retire = tuple(p for p in others if p != final)
            replace_folder(final, _graph_filler(gm, metas, final.name, args if now else None),
                           fields, pending=(f"{final.name}.pt",) if late else (), retire=retire)
            run.claimed = True
        log.info("wrote graph dump %s (run %s)", final, run.run_id)
        if late:
            return _saving_first_inputs(gm, lambda real: self._save_late(run, final, real))
        return gm

    def _save_late(self, run: _Run, folder: Path, args: Sequence[Any]) -> None:
        """Save the real inputs of a graph's first run into its folder, if still this run's."""
        name = f"{folder.name}.pt"
        with self._scope.locked():
            try:
                manifest: DumpManifest | None = read_manifest(folder, verify=False)
            except GraphDumpError:
                manifest = None
            if manifest is None or manifest.run_id != run.run_id:
                log.warning("example inputs of %s (run %s) not saved: the folder now holds "
                            "another run's graph (%s)", folder, run.run_id,
                            manifest.run_id if manifest else "none")
                return
            if name not in manifest.pending:
                return
            try:
                add_file(folder, name, lambda path: torch.save(_flat_inputs(args), path))
            except Exception as error:
                raise GraphDumpError(f"saving the example inputs {folder / name} failed: "
                                     f"{type(error).__name__}: {error}") from error

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from aot_partition import default_partition
        from torch._functorch.aot_autograd import aot_module_simplified

        from .fusion import default_decompositions

        index = self.graph_index
        self.graph_index += 1
        run = self._start_run(index)

        # Parameter names as in torch's AOTDispatchCompiler protocol (fw_compiler/bw_compiler).
        def save_forward(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
            return self._save(gm, example_inputs, "forward", run)

        def save_backward(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
            return self._save(gm, example_inputs, "backward", run)

        def save_joint(joint: fx.GraphModule, joint_args: Sequence[Any], **kwargs: Any
                       ) -> tuple[fx.GraphModule, fx.GraphModule]:
            # The joint graph never runs, so with fake joint_args it gets no .pt file.
            self._save(joint, joint_args, "joint", run)
            return default_partition(joint, joint_args, **kwargs)

        return aot_module_simplified(gm, example_inputs, fw_compiler=save_forward,
                                     bw_compiler=save_backward, partition_fn=save_joint,
                                     decompositions=default_decompositions)


def graph_dumper_aot(current_name: str, folder_name: str | os.PathLike[str],
                     dump_example_input: bool = False) -> GraphDumper:
    """A back end dumping forward, backward and joint graphs; use as
    ``torch.compile(model, backend=graph_dumper_aot("model", "dumps"))``."""
    return GraphDumper(current_name, folder_name, dump_example_input)


# -- reading dumps -------------------------------------------------------------------------
@dataclass(frozen=True)
class DumpGroup:
    """The dumped graphs of one index: at most a joint, a forward and a backward, all of one run.

    ``folders`` and ``manifests`` map each kind found complete to its folder and manifest;
    ``problems`` says what was left out and why (an incomplete folder, another run's folder).
    ``run_id`` is the run the folders belong to (``None`` when there are none, or for folders
    written by aot_compilers 0.1, which carry no run id).
    """

    root: Path
    name: str
    index: int
    run_id: str | None
    folders: dict[str, Path] = field(default_factory=dict)
    manifests: dict[str, DumpManifest] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if k in self.folders)


def read_dump(folder_name: str | os.PathLike[str], current_name: str, index: int = 0
              ) -> DumpGroup:
    """The complete dump folders of graph ``index`` of ``graph_dumper_aot(current_name,
    folder_name)``, all from one run.

    Takes the dump lock (when the folder is writable), so it sees no write half done; it first
    puts back a dump a killed writer left in a hidden ``.old`` folder and removes dead writers'
    temporaries. Folders that are incomplete (a file listed in the manifest is missing) or belong
    to another run than the newest one found are left out and named in ``problems``.
    """
    if not isinstance(current_name, str) or not _IDENTIFIER.match(current_name):
        raise ValueError(f"current_name must be a Python identifier, got {current_name!r}")
    root = Path(folder_name) / current_name
    manifests: dict[str, DumpManifest] = {}
    problems: list[str] = []
    with DumpScope.for_dumper(root, current_name).locked(for_reading=True):
        for kind in KINDS:
            folder = root / f"{current_name}_{kind}_{index}"
            if not (folder.exists() or folder.is_symlink()):
                continue
            try:
                manifests[kind] = read_manifest(folder)
            except GraphDumpError as error:
                problems.append(str(error))
    runs = {m.run_id for m in manifests.values()}
    if len(runs) > 1:  # not written by this version's dumper (e.g. folders copied together)
        newest = max(manifests.values(), key=lambda m: m.created or 0.0).run_id
        for kind, manifest in list(manifests.items()):
            if manifest.run_id != newest:
                problems.append(f"{manifest.folder} belongs to run {manifest.run_id}, not to "
                                f"run {newest} of the group's newest folder; left out")
                del manifests[kind]
    return DumpGroup(root=root, name=current_name, index=index,
                     run_id=next(iter(manifests.values())).run_id if manifests else None,
                     folders={k: m.folder for k, m in manifests.items()}, manifests=manifests,
                     problems=tuple(problems))


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

    def fill(tmp: Path) -> None:
        _write_module(gm, tmp)
        dump_input_meta(metas, tmp / "repro.input")
        (tmp / "repro.py").write_text(_REPRO_SCRIPT.format(script=final / "repro.py",
                                                           input_file="repro.input"))

    with DumpScope.for_folder(final).locked():
        replace_folder(final, fill, {"run_id": new_run_id(), "kind": "repro"})
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
