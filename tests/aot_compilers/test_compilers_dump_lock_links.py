"""The dump lock is never followed through a link (issue 27): a symbolic link (or a FIFO) where
the lock file goes is a GraphDumpError, and nothing is created outside the dump folder."""

from __future__ import annotations

import os

import pytest
import torch
import torch.fx as fx
from aot_compilers import GraphDumpError, graph_dumper_aot
from torch import nn

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return (torch.tanh(self.fc(x)),)  # a tuple, as aot_module_simplified needs


def dump_tiny(folder) -> None:
    """One forward and backward of a linear layer through the dumper (as "tiny")."""
    torch.manual_seed(0)
    module = _Tiny()
    x = torch.randn(3, 8, requires_grad=True)
    compiled = graph_dumper_aot("tiny", folder)(fx.symbolic_trace(module), [x])
    out = compiled(x)
    (out[0] if isinstance(out, (list, tuple)) else out).sum().backward()


def refusal(lock, what: str) -> str:
    return (f"the dump lock {lock} is {what}; refusing to use it (a lock must be a regular file "
            "beside the dump folder): remove it and dump again")


def test_a_lock_that_is_a_dangling_link_is_refused(tmp_path):
    dumps, outside = tmp_path / "dumps", tmp_path / "outside"
    dumps.mkdir()
    outside.mkdir()
    lock = dumps / ".tiny.aot_compilers.lock"
    lock.symlink_to(outside / "created_by_the_dumper")
    with pytest.raises(GraphDumpError) as info:
        dump_tiny(dumps)
    assert str(info.value) == refusal(lock, "a symbolic link")
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in dumps.iterdir()) == [".tiny.aot_compilers.lock", "tiny"]
    assert list((dumps / "tiny").iterdir()) == []  # the dump root, made before the lock


def test_a_lock_that_links_to_an_existing_file_is_refused(tmp_path):
    dump_tiny(tmp_path)
    lock = tmp_path / ".tiny.aot_compilers.lock"
    target = tmp_path / "elsewhere.lock"
    lock.rename(target)
    lock.symlink_to(target)
    with pytest.raises(GraphDumpError) as info:
        dump_tiny(tmp_path)
    assert str(info.value) == refusal(lock, "a symbolic link")
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [
        "tiny_backward_0", "tiny_forward_0", "tiny_joint_0"]  # the first run's dumps only


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_lock_that_is_a_fifo_is_refused(tmp_path):
    lock = tmp_path / ".tiny.aot_compilers.lock"
    os.mkfifo(lock)
    with pytest.raises(GraphDumpError) as info:
        dump_tiny(tmp_path)
    assert str(info.value) == refusal(lock, "not a regular file")


def test_a_regular_lock_file_is_used(tmp_path):
    (tmp_path / ".tiny.aot_compilers.lock").touch()
    dump_tiny(tmp_path)
    assert (tmp_path / "tiny" / "tiny_forward_0" / "module.py").exists()
