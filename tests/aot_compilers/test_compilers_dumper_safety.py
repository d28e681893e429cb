"""The graph dumper against untrusted .input files, concurrent writers and killed processes.

Writers are killed in forked children (no new interpreter to start, so every step of the write
protocol can be tried): either by the step hook of ``aot_compilers.dump_store`` calling
``os._exit`` at a chosen step, or by SIGKILL after a random delay.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import signal
import time
import traceback
from pathlib import Path

import aot_compilers.dump_store as store
import pytest
import torch
import torch.fx as fx
from aot_compilers import (
    GraphDumpError,
    UntrustedInputError,
    get_inputs,
    graph_dumper_aot,
    input_meta,
    load_input_meta,
    read_dump,
    read_manifest,
)
from aot_compilers.dumper import KINDS, GraphDumper, write_graph_folder
from torch import nn

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.skipif(not hasattr(os, "fork"), reason="kills forked writers")]

CRASHED = 77  # exit status of a child killed by the step hook


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return (torch.tanh(self.fc(x)).sum(-1),)


def compile_tiny(folder, name="tiny", dump_example_input=True):
    """Compile TinyNet through a fresh dumper (joint and forward are written); return
    (dumper, run) where run() runs forward and backward (the backward is compiled lazily)."""
    module = TinyNet()
    x = torch.randn(3, 8, requires_grad=True)
    dumper = graph_dumper_aot(name, folder, dump_example_input=dump_example_input)
    compiled = dumper(fx.symbolic_trace(module), [x])

    def run():
        compiled(x)[0].sum().backward()
    return dumper, run


def graph(op):
    """A one-op graph module: x + 1 or x * 2 (told apart in module.py by the op's name)."""
    def add(x):
        return x + 1

    def mul(x):
        return x * 2
    return fx.symbolic_trace({"add": add, "mul": mul}[op])


X = torch.ones(2, 3)


def hidden(folder: Path) -> list[str]:
    """Hidden entries (temporaries, leftovers) in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def in_child(fn, crash_at: int | None = None, timeout: float = 60.0) -> int:
    """Run ``fn`` in a forked child; with ``crash_at``, the child dies (os._exit) at the
    ``crash_at``-th step of the dump protocol. Returns the child's exit status."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 0
        try:
            torch.set_num_threads(1)  # no OpenMP pool after fork
            if crash_at is not None:
                seen = [0]

                def hook(step):
                    if seen[0] == crash_at:
                        os._exit(CRASHED)
                    seen[0] += 1
                store._step_hook = hook
            fn()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child writer {pid} hung")
        time.sleep(0.005)


def record_steps(fn) -> list[str]:
    steps: list[str] = []
    store._step_hook = steps.append
    try:
        fn()
    finally:
        store._step_hook = None
    return steps


def exchange_works(folder: Path) -> bool:
    a, b = folder / "xa", folder / "xb"
    a.mkdir()
    b.mkdir()
    try:
        return store._exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


@pytest.fixture(params=["exchange", "two-renames"])
def swap_mode(request, tmp_path, monkeypatch):
    if request.param == "exchange" and not exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) unsupported here")
    monkeypatch.setattr(store, "_use_exchange", request.param == "exchange")
    return request.param


# -- .input files are loaded safely --------------------------------------------------------
class MakesADirectory:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


class CallsTensor:
    def __reduce__(self):
        return (torch.Tensor, (10,))


class Plain:
    def __init__(self):
        self.a = 1


def test_get_inputs_refuses_a_pickle_that_would_run_code(tmp_path):
    evil = tmp_path / "evil.input"
    evil.write_bytes(pickle.dumps([(int,), MakesADirectory(tmp_path / "pwned")]))
    with pytest.raises(UntrustedInputError, match=(
            r"get_inputs: refusing to load .*evil\.input: it uses the global posix\.mkdir, "
            r"which a graph-dump \.input file never contains \(allowed: int, float, bool, "
            r"torch\.Tensor.*get_inputs\(\.\.\., trusted=True\)")):
        get_inputs(evil)
    with pytest.raises(UntrustedInputError, match=r"^load_input_meta: refusing to load"):
        load_input_meta(evil)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("payload, refused", [
    ([Plain()], r"the pickle opcode (NEWOBJ|BUILD)"),
    ([{"a": 1}], r"the pickle opcode EMPTY_DICT"),
    ([CallsTensor()], r"a call of torch\.Tensor"),
], ids=["object", "dict", "tensor-call"])
def test_get_inputs_refuses_anything_a_dump_never_holds(tmp_path, payload, refused):
    path = tmp_path / "x.input"
    path.write_bytes(pickle.dumps(payload))
    with pytest.raises(UntrustedInputError, match=refused):
        get_inputs(path)


def test_trusted_opts_into_full_unpickling(tmp_path):
    path = tmp_path / "x.input"
    path.write_bytes(pickle.dumps([MakesADirectory(tmp_path / "ran")]))
    # The payload runs (that is what trusting means), then the result is still checked.
    with pytest.raises(GraphDumpError, match=r"get_inputs: .*input 0 metadata None is neither"):
        get_inputs(path, trusted=True)
    assert (tmp_path / "ran").is_dir()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_get_inputs_reads_every_pickle_protocol(tmp_path, protocol):
    inputs = [torch.randn(3, 4).t(), 7, 0.5, True, torch.zeros(2, dtype=torch.int32)]
    path = tmp_path / "x.input"
    path.write_bytes(pickle.dumps(input_meta(inputs), protocol=protocol))
    assert load_input_meta(path) == input_meta(inputs)
    assert input_meta(get_inputs(path)) == input_meta(inputs)


@pytest.mark.parametrize("content, message", [
    (pickle.dumps([(int,)])[:-3], r"get_inputs: cannot read input metadata .*not a valid pickle"),
    (pickle.dumps([(torch.Tensor, (2, -1), (1, 1), torch.float32, "cpu")]),
     r"input 0 metadata .* is not a valid tensor entry .*non-negative ints"),
    (pickle.dumps([(torch.Tensor, torch.Size([2]), (1,), torch.float32,
                    torch.device("cpu"))]).replace(b"cpu", b"xyz"),
     r"get_inputs: cannot read input metadata .*RuntimeError.*xyz"),
], ids=["truncated", "negative-size", "bad-device"])
def test_get_inputs_names_the_file_for_malformed_metadata(tmp_path, content, message):
    path = tmp_path / "x.input"
    path.write_bytes(content)
    with pytest.raises(GraphDumpError, match=message):
        get_inputs(path)


# -- manifests, run ids and groups ---------------------------------------------------------
def test_one_compile_is_one_run_listed_in_every_manifest(tmp_path):
    dumper, run = compile_tiny(tmp_path)
    run()
    group = read_dump(tmp_path, "tiny")
    assert group.kinds == KINDS and group.problems == ()
    assert group.run_id == dumper.run_ids[0]
    for kind, manifest in group.manifests.items():
        assert manifest.run_id == group.run_id and manifest.kind == kind
        assert manifest.index == 0 and manifest.group == "tiny_0" and manifest.pending == ()
        name = f"tiny_{kind}_0"
        assert {"module.py", "__init__.py", f"{name}.input"} <= set(manifest.files)
        assert (f"{name}.pt" in manifest.files) == (kind != "joint")  # the joint never runs
        for file, size in manifest.files.items():
            assert (group.folders[kind] / file).stat().st_size == size


def test_a_superseded_runs_late_graphs_and_inputs_are_not_mixed_in(tmp_path, caplog):
    """The reported crash: run A compiled (joint, forward written), run B dumped the same name
    completely, then A ran: its first-run inputs and lazily compiled backward used to land in
    B's group (or crash on a vanished temporary file)."""
    a, run_a = compile_tiny(tmp_path)
    b, run_b = compile_tiny(tmp_path)
    run_b()
    with caplog.at_level(logging.WARNING, logger="aot_compilers"):
        run_a()
    assert "example inputs of" in caplog.text and "not saved" in caplog.text
    assert "was taken over by another dumper" in caplog.text
    group = read_dump(tmp_path, "tiny")
    assert group.run_id == b.run_ids[0] != a.run_ids[0]
    assert group.kinds == KINDS and group.problems == ()
    assert all(m.run_id == group.run_id for m in group.manifests.values())
    assert "tiny_forward_0.pt" in group.manifests["forward"].files
    assert "tiny_backward_0.pt" in group.manifests["backward"].files


def test_a_new_run_replaces_every_graph_of_the_old_group(tmp_path):
    _, run_a = compile_tiny(tmp_path)
    run_a()  # joint, forward and backward of run A
    dumper = GraphDumper("tiny", tmp_path)
    run = dumper._start_run(0)
    dumper._save(graph("add"), [X], "forward", run)  # an inference-only run: forward only
    group = read_dump(tmp_path, "tiny")
    assert group.kinds == ("forward",) and group.run_id == run.run_id
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["tiny_forward_0"]


def test_read_dump_leaves_out_and_names_incomplete_or_foreign_folders(tmp_path):
    _, run = compile_tiny(tmp_path, dump_example_input=False)
    run()
    (tmp_path / "tiny" / "tiny_backward_0" / "module.py").unlink()
    other = tmp_path / "tiny" / "tiny_joint_0" / ".aot_compilers_dump"
    data = json.loads(other.read_text())
    other.write_text(json.dumps({**data, "run_id": "someone-else", "created": 0.0}))
    group = read_dump(tmp_path, "tiny")
    assert group.kinds == ("forward",)
    assert any("tiny_backward_0 is incomplete: module.py" in p for p in group.problems)
    assert any("tiny_joint_0 belongs to run someone-else" in p for p in group.problems)


def test_a_folder_of_the_previous_version_is_still_replaced(tmp_path):
    legacy = tmp_path / "g"
    legacy.mkdir()
    (legacy / ".aot_compilers_dump").touch()  # aot_compilers 0.1: an empty marker
    assert read_manifest(legacy).run_id is None
    write_graph_folder(graph("add"), [X], legacy)
    assert read_manifest(legacy).run_id is not None
    assert "add" in (legacy / "module.py").read_text()


# -- killed writers ------------------------------------------------------------------------
def assert_old_or_new(final: Path, old_run: str, strict: bool) -> str:
    """``final`` holds the old dump (x + 1, run ``old_run``) or a new one (x * 2), complete.
    Returns which. Without ``strict`` it may be missing (then an orphaned ``.old`` exists)."""
    if not strict and not final.exists():
        assert [n for n in hidden(final.parent) if n.endswith(".old")]
        return "missing"
    manifest = read_manifest(final)  # verifies every listed file
    code = (final / "module.py").read_text()
    if manifest.run_id == old_run:
        assert "add" in code and "mul" not in code
        return "old"
    assert "mul" in code and "add" not in code
    return "new"


def test_a_writer_killed_at_any_step_leaves_the_old_or_the_new_dump(tmp_path, swap_mode):
    final = tmp_path / "g"
    write_graph_folder(graph("add"), [X], final)
    write_graph_folder(graph("add"), [X], tmp_path / "probe")
    steps = record_steps(lambda: write_graph_folder(graph("mul"), [X], tmp_path / "probe"))
    assert steps[-2:] == ["swapped", "cleaned"]
    assert ("old-moved" in steps) == (swap_mode == "two-renames")
    seen = set()
    for k, step in enumerate(steps):
        write_graph_folder(graph("add"), [X], final)  # the old dump; also cleans leftovers
        assert hidden(tmp_path) == [".g.aot_compilers.lock", ".probe.aot_compilers.lock"]
        old_run = read_manifest(final).run_id
        status = in_child(lambda: write_graph_folder(graph("mul"), [X], final), crash_at=k)
        assert status == CRASHED, f"the writer never reached step {k} ({step})"
        # Right after the kill, without any recovery: with RENAME_EXCHANGE the folder is never
        # missing; with two renames only between them.
        state = assert_old_or_new(final, old_run, strict=swap_mode == "exchange")
        assert state != "missing" or step == "old-moved"
        seen.add(state)
        # The next access puts an orphaned old dump back, and finds it complete.
        assert len(get_inputs(final / "g.input")) == 1
        assert assert_old_or_new(final, old_run, strict=True) == (
            "new" if step in ("swapped", "cleaned") else "old")
    assert seen >= {"old", "new"}
    write_graph_folder(graph("mul"), [X], final)  # the next write cleans every leftover
    assert hidden(tmp_path) == [".g.aot_compilers.lock", ".probe.aot_compilers.lock"]


def group_state(root: Path, name: str = "g") -> tuple[str | None, tuple[str, ...]]:
    group = read_dump(root, name)
    assert group.problems == ()
    assert all(m.run_id == group.run_id for m in group.manifests.values())
    return group.run_id, group.kinds


def full_run(root: Path, op: str, name: str = "g", index: int = 0) -> str:
    dumper = GraphDumper(name, root)
    run = dumper._start_run(index)
    for kind in KINDS:
        dumper._save(graph(op), [X], kind, run)
    return run.run_id


def test_a_dumper_killed_at_any_step_never_mixes_two_runs(tmp_path, swap_mode):
    full_run(tmp_path / "probe", "add")
    # A second run claims the group, replacing the first run's graphs.
    steps = record_steps(lambda: full_run(tmp_path / "probe", "mul"))
    assert steps.count("retired") == 2
    for k in range(len(steps)):
        old_run = full_run(tmp_path, "add")
        assert hidden(tmp_path / "g") == []
        status = in_child(lambda: full_run(tmp_path, "mul"), crash_at=k)
        assert status == CRASHED
        run_id, kinds = group_state(tmp_path)  # recovers first, then reads under the lock
        if run_id == old_run:  # the old run's graphs, minus those already retired
            assert kinds and set(kinds) <= set(KINDS)
        else:  # the new run's graphs written so far, in the order it writes them
            assert kinds == KINDS[:len(kinds)] and kinds
    new_run = full_run(tmp_path, "mul")
    assert group_state(tmp_path) == (new_run, KINDS)
    assert hidden(tmp_path / "g") == []


def test_a_writer_killed_while_adding_first_run_inputs(tmp_path, swap_mode):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(X)

    def compile_and_run():
        dumper = GraphDumper("g", tmp_path, dump_example_input=True)
        run = dumper._start_run(0)
        runner = dumper._save(graph("add"), [fake], "forward", run)
        runner([X])  # the first run saves the real inputs

    compile_and_run()
    steps = record_steps(compile_and_run)  # replacing the folder, as every child below does
    late = steps[steps.index("file-written"):]
    assert late == ["file-written", "file-renamed", "manifest-updated"]
    folder = tmp_path / "g" / "g_forward_0"
    for step in late:
        status = in_child(compile_and_run, crash_at=steps.index(step))
        assert status == CRASHED
        manifest = read_manifest(folder)
        listed = "g_forward_0.pt" in manifest.files
        assert listed == (step == "manifest-updated")
        assert listed != ("g_forward_0.pt" in manifest.pending)
        if listed:
            assert torch.equal(torch.load(folder / "g_forward_0.pt")[0], X)
        assert (len(hidden(tmp_path / "g")) == 1) == (step == "file-written")  # its temporary
        # Another graph's write in the same dumper folder removes the dead writer's temporary.
        full_run(tmp_path, "mul", index=1)
        assert hidden(tmp_path / "g") == [] and hidden(folder) == [".aot_compilers_dump"]


@pytest.mark.parametrize("trial_seed", [0])
def test_writers_killed_at_random_moments(tmp_path, swap_mode, trial_seed):
    rng = random.Random(trial_seed)
    final = tmp_path / "g"
    write_graph_folder(graph("add"), [X], final)

    graphs = [graph("add"), graph("mul")]

    def write_forever():
        for i in range(10_000):
            write_graph_folder(graphs[i % 2], [X], final)

    outcomes = []
    for _ in range(16):
        pid = os.fork()
        if pid == 0:
            try:
                torch.set_num_threads(1)
                write_forever()
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if swap_mode == "exchange":  # never missing, never incomplete, even before recovery
            read_manifest(final)
        outcomes.append(len(hidden(tmp_path)))
        get_inputs(final / "g.input")  # recovers an orphaned .old
        read_manifest(final)
    write_graph_folder(graph("add"), [X], final)
    assert hidden(tmp_path) == [".g.aot_compilers.lock"]
    assert max(outcomes) > 1, "no kill ever left a leftover behind; the test proves nothing"


def test_without_a_lock_only_dead_or_old_leftovers_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "fcntl", None)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that is surely gone
    final = tmp_path / "g"
    dead = tmp_path / f".g.{pid}.abcd1234.tmp"
    live = tmp_path / f".g.{os.getpid()}.abcd1234.tmp"
    aged = tmp_path / ".g.efgh5678.tmp"  # the name aot_compilers 0.1 used: no pid
    for path in (dead, live, aged):
        path.mkdir()
    os.utime(aged, (0, 0))
    write_graph_folder(graph("add"), [X], final)
    assert hidden(tmp_path) == sorted([".g.aot_compilers.lock", live.name])
    monkeypatch.setattr(store, "fcntl", __import__("fcntl"))
    write_graph_folder(graph("add"), [X], final)  # with the lock: every leftover is dead
    assert hidden(tmp_path) == [".g.aot_compilers.lock"]


def test_an_orphan_of_the_previous_version_is_restored(tmp_path):
    orphan = tmp_path / "tiny" / ".tiny_forward_0.abcd1234.old" / "tiny_forward_0"
    orphan.mkdir(parents=True)
    (orphan / ".aot_compilers_dump").touch()
    (orphan / "tiny_forward_0.input").write_bytes(pickle.dumps([(int,)]))
    (tmp_path / ".tiny.aot_compilers.lock").touch()
    assert len(get_inputs(tmp_path / "tiny" / "tiny_forward_0" / "tiny_forward_0.input")) == 1
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["tiny_forward_0"]


# -- concurrent writers --------------------------------------------------------------------
def plus(c: int) -> fx.GraphModule:
    """``x + c``: module.py then reads ``add = x + <c>``, telling runs apart by their files."""
    return fx.symbolic_trace(lambda x: x + c)


def constant_of(folder: Path) -> int:
    return int(re.search(r"x \+ (\d+)", (folder / "module.py").read_text())[1])


def call(compiled, args):
    """Call a compiler's result as AOTAutograd does: boxed (one list) or not."""
    return compiled(args) if getattr(compiled, "_boxed_call", False) else compiled(*args)


def emulated_run(root: Path, c: int, fake: torch.Tensor, pause) -> str:
    """One compile as the dumper sees it through torch.compile, in the same order: the joint
    and forward are compiled (fake inputs), the forward runs (its real inputs are saved), the
    backward is compiled lazily, then runs. Every graph and input of this run carries ``c``.
    (Forked children cannot run autograd once pytest has, hence no real compile here; the real
    interleaving is test_a_superseded_runs_late_graphs_and_inputs_are_not_mixed_in.)"""
    dumper = GraphDumper("tiny", root, dump_example_input=True)
    run = dumper._start_run(0)
    dumper._save(plus(c), [fake], "joint", run)
    pause()
    forward = dumper._save(plus(c), [fake], "forward", run)
    pause()
    call(forward, [X * c])
    pause()
    backward = dumper._save(plus(c), [fake], "backward", run)
    pause()
    call(backward, [X * c])
    return run.run_id


def snapshot(root: Path) -> tuple[set[str], set[int]]:
    """Under the dump lock: the run ids and constants of the group's folders and inputs."""
    runs, constants = set(), set()
    with store.DumpScope.for_dumper(root / "tiny", "tiny").locked():
        for kind in KINDS:
            folder = root / "tiny" / f"tiny_{kind}_0"
            if not folder.exists():
                continue
            manifest = read_manifest(folder)  # complete: every listed file, of the listed size
            runs.add(manifest.run_id)
            constants.add(constant_of(folder))
            if f"{folder.name}.pt" in manifest.files:
                saved = torch.load(folder / f"{folder.name}.pt")[0]
                constants.add(int(saved[0, 0].item()))
    return runs, constants


def test_two_processes_dumping_the_same_name_never_crash_or_mix(tmp_path):
    """Two processes dump the same name for many rounds at once, with random pauses between
    the steps of a compile; a reader checks the group under the lock meanwhile."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(X)
    rounds, go = 15, tmp_path / "go"
    outs = [tmp_path / f"runs{i}.json" for i in range(2)]

    def writer(i: int) -> None:
        rng = random.Random(i)
        while not go.exists():
            time.sleep(0.001)
        runs = {}
        for r in range(rounds):
            c = 100 * (i + 1) + r
            runs[emulated_run(tmp_path, c, fake, lambda: time.sleep(rng.uniform(0, 0.004)))] = c
        outs[i].write_text(json.dumps(runs))

    pids = []
    for i in range(2):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                torch.set_num_threads(1)
                logging.disable(logging.WARNING)  # losing the group to the other is expected
                writer(i)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    go.touch()
    status, polls, deadline = {}, 0, time.monotonic() + 60
    while len(status) < 2:
        runs, constants = snapshot(tmp_path)
        assert len(runs) <= 1 and len(constants) <= 1, (runs, constants)  # never mixed
        polls += 1
        for pid in set(pids) - set(status):
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status[pid] = os.waitstatus_to_exitcode(code)
        if time.monotonic() > deadline:
            for pid in set(pids) - set(status):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            pytest.fail("concurrent writers hung")
        time.sleep(0.002)
    assert [status[pid] for pid in pids] == [0, 0], "a writer crashed (traceback above)"
    runs = {**json.loads(outs[0].read_text()), **json.loads(outs[1].read_text())}
    assert len(runs) == 2 * rounds and polls > 1
    # The last run to claim the group completed it: all three graphs and both inputs, its own.
    group = read_dump(tmp_path, "tiny")
    assert group.kinds == KINDS and group.problems == () and group.run_id in runs
    assert snapshot(tmp_path) == ({group.run_id}, {runs[group.run_id]})
    assert "tiny_forward_0.pt" in group.manifests["forward"].files
    assert "tiny_backward_0.pt" in group.manifests["backward"].files
    assert hidden(tmp_path / "tiny") == []
