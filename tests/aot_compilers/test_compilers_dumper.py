"""graph_dumper_aot, get_inputs and debug_compile."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx
from aot_compilers import (
    GraphDumpError,
    debug_compile,
    get_inputs,
    graph_dumper_aot,
    input_meta,
    nop,
)
from subprocess_limits import SUBPROCESS_TIMEOUT_S
from torch import nn

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        # A tuple: aot_module_simplified (what the dumper runs on) needs tuple outputs.
        return (torch.tanh(self.fc(x)).sum(-1),)


def dump_tiny(folder, name="tiny", dump_example_input=False, dumper=None):
    """Run TinyNet forward and backward through the dumper; return (dumper, x, module)."""
    module = TinyNet()
    x = torch.randn(3, 8, requires_grad=True)
    dumper = dumper or graph_dumper_aot(name, folder, dump_example_input=dump_example_input)
    compiled = dumper(fx.symbolic_trace(module), [x])
    out = compiled(x)
    (out[0] if isinstance(out, (list, tuple)) else out).sum().backward()
    return dumper, x, module


def test_writes_forward_backward_and_joint_folders(tmp_path):
    dump_tiny(tmp_path, dump_example_input=True)
    root = tmp_path / "tiny"
    assert sorted(p.name for p in root.iterdir()) == [
        "tiny_backward_0", "tiny_forward_0", "tiny_joint_0"]
    for kind in ("forward", "backward", "joint"):
        folder = root / f"tiny_{kind}_0"
        assert {"module.py", "__init__.py", f"tiny_{kind}_0.input"} <= {
            p.name for p in folder.iterdir()}
    # Real inputs are saved on the first run for the graphs that run; the joint never runs.
    saved = torch.load(root / "tiny_forward_0" / "tiny_forward_0.pt")
    assert [t.shape for t in saved] == [torch.Size([4, 8]), torch.Size([4]),
                                        torch.Size([3, 8])]
    assert (root / "tiny_backward_0" / "tiny_backward_0.pt").exists()
    assert not (root / "tiny_joint_0" / "tiny_joint_0.pt").exists()


def test_input_metadata_matches_the_graph_inputs(tmp_path):
    dump_tiny(tmp_path)
    with open(tmp_path / "tiny" / "tiny_forward_0" / "tiny_forward_0.input", "rb") as f:
        metas = pickle.load(f)
    assert metas == [
        (torch.Tensor, torch.Size([4, 8]), (8, 1), torch.float32, torch.device("cpu")),
        (torch.Tensor, torch.Size([4]), (1,), torch.float32, torch.device("cpu")),
        (torch.Tensor, torch.Size([3, 8]), (8, 1), torch.float32, torch.device("cpu")),
    ]
    with open(tmp_path / "tiny" / "tiny_joint_0" / "tiny_joint_0.input", "rb") as f:
        joint = pickle.load(f)
    assert len(joint) == 4  # primals (weight, bias, x) then the tangent, flattened


def test_forward_graph_imports_and_runs_in_a_fresh_process(tmp_path):
    _, x, module = dump_tiny(tmp_path, dump_example_input=True)
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(tmp_path / "tiny")!r})
        from aot_compilers import get_inputs
        from tiny_forward_0 import FxModule
        folder = {str(tmp_path / "tiny" / "tiny_forward_0")!r}
        random_inputs = get_inputs(folder + "/tiny_forward_0.input")
        assert [t.shape for t in random_inputs] == [(4, 8), (4,), (3, 8)]
        FxModule()(*random_inputs)
        real_inputs = torch.load(folder + "/tiny_forward_0.pt")
        torch.save(FxModule()(*real_inputs)[0], {str(tmp_path / "out.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=SUBPROCESS_TIMEOUT_S,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"})
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), module(x)[0].detach())


def test_graph_index_counts_per_dumper(tmp_path):
    dumper, _, _ = dump_tiny(tmp_path, name="first")
    dump_tiny(tmp_path, dumper=dumper)  # a second graph through the same dumper
    other, _, _ = dump_tiny(tmp_path, name="second")  # a new dumper starts again at 0
    assert dumper.graph_index == 2 and other.graph_index == 1
    assert (tmp_path / "first" / "first_forward_1").is_dir()
    assert (tmp_path / "second" / "second_forward_0").is_dir()


def test_dumper_is_a_torch_compile_backend(tmp_path, fresh_dynamo):
    module = TinyNet()
    x = torch.randn(3, 8, requires_grad=True)
    compiled = torch.compile(module, backend=graph_dumper_aot("net", tmp_path))
    out = compiled(x)
    torch.testing.assert_close(out, module(x))
    out[0].sum().backward()
    assert (tmp_path / "net" / "net_backward_0" / "module.py").exists()


def test_unwritable_folder_fails_clearly_and_writes_nothing(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the dump folder's parent should be")
    with pytest.raises(GraphDumpError, match=r"cannot create dump folder .*not_a_folder/dumps/tiny: .*Not a directory"):
        dump_tiny(blocker / "dumps")
    assert blocker.read_text().startswith("a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_a_folder"]


def test_failure_mid_write_leaves_no_partial_graph(tmp_path, monkeypatch):
    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pickle, "dump", broken_dump)
    with pytest.raises(GraphDumpError, match=r"tiny_joint_0 failed, nothing written: OSError: "
                                             r"disk full"):
        dump_tiny(tmp_path)
    assert list((tmp_path / "tiny").iterdir()) == []  # no graph folder, no temporary folder


def test_a_new_dump_replaces_an_old_one_but_never_a_foreign_folder(tmp_path):
    dump_tiny(tmp_path)
    dump_tiny(tmp_path)  # same name and index: replaced atomically
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [
        "tiny_backward_0", "tiny_forward_0", "tiny_joint_0"]
    foreign = tmp_path / "mine" / "mine_joint_0"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(GraphDumpError, match=r"mine_joint_0 exists and is not a graph dump"):
        dump_tiny(tmp_path, name="mine")
    assert (foreign / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("bad", ["", "has space", "../escape", "1starts_with_digit"])
def test_current_name_must_be_an_identifier(tmp_path, bad):
    with pytest.raises(ValueError, match=r"current_name must be a Python identifier"):
        graph_dumper_aot(bad, tmp_path)


def test_get_inputs_rebuilds_scalars_and_strided_tensors(tmp_path):
    metas = [
        (int,), (float,), (bool,),
        (torch.Tensor, torch.Size([2, 3]), (1, 2), torch.float32, torch.device("cpu")),
        (torch.Tensor, torch.Size([5]), (1,), torch.int64, torch.device("cpu")),
        (torch.Tensor, torch.Size([4]), (1,), torch.bool, torch.device("cpu")),
    ]
    path = tmp_path / "x.input"
    path.write_bytes(pickle.dumps(metas))
    i, f, b, strided, ints, flags = get_inputs(path)
    assert type(i) is int and 1 <= i <= 8
    assert type(f) is float and 0.0 <= f < 1.0
    assert type(b) is bool
    assert strided.shape == (2, 3) and strided.stride() == (1, 2)
    assert ((0 <= strided) & (strided < 1)).all()
    assert ints.dtype == torch.int64 and (ints == 0).all()
    assert flags.dtype == torch.bool


def test_get_inputs_round_trips_input_meta(tmp_path):
    inputs = [torch.randn(3, 4).t(), 7, 0.5, torch.zeros(2, dtype=torch.int32)]
    path = tmp_path / "x.input"
    path.write_bytes(pickle.dumps(input_meta(inputs)))
    rebuilt = get_inputs(path)
    assert input_meta(rebuilt) == input_meta(inputs)


def test_get_inputs_rejects_bad_metadata(tmp_path):
    path = tmp_path / "bad.input"
    path.write_bytes(pickle.dumps([(torch.Tensor, (2,))]))
    with pytest.raises(GraphDumpError, match=r"input 0 metadata .* is neither \(type,\) nor"):
        get_inputs(path)
    with pytest.raises(GraphDumpError, match=r"cannot read input metadata .*missing\.input"):
        get_inputs(tmp_path / "missing.input")


def test_input_meta_refuses_unsupported_inputs():
    with pytest.raises(GraphDumpError, match=r"input 1 is a str; graph dumps can record"):
        input_meta([torch.ones(1), "text"])


def test_debug_compile_writes_a_runnable_reproduction(tmp_path, capsys):
    gm = fx.symbolic_trace(TinyNet())
    x = torch.randn(3, 8)
    folder = tmp_path / "repro"
    compiled = debug_compile(gm, [x], folder=folder, compiler=nop)
    torch.testing.assert_close(compiled([x]), gm(x))
    printed = capsys.readouterr().out
    assert f"python {folder / 'repro.py'}" in printed
    result = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True,
                            text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert "output 0: shape=(3,) dtype=torch.float32" in result.stdout
