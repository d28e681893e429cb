"""Every example in the root README and aot-pipeline's README runs, as written.

Each ``uv run aot-pipeline ...`` / ``uv run aot-config ...`` line of a ```bash block is run
through the command's ``main`` (the console script's entry point) in a scratch folder that holds
the files the examples name: ``mypackage/models.py`` and ``path/to/model.py`` with a ``build``
factory, and a ``model.pt2`` saved by ``torch.export.save``. Each ```python block runs as a
script. An example that stops working (a renamed option, a changed API) fails here, so the docs
cannot drift.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
READMES = [ROOT / "README.md", ROOT / "packages" / "aot-pipeline" / "README.md"]
# Lines of a bash block that are not examples of ours.
NOT_OURS = {"uv run pytest", "uv run pytest -n 2 --dist loadfile"}
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)

FACTORY = textwrap.dedent('''
    import torch
    from torch import nn


    def build():
        """A tiny language model: embeddings, one MLP block, a head."""
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(50257, 16), nn.Linear(16, 32), nn.GELU(),
                             nn.Linear(32, 16))
''')
FACTORY_WITH_INPUTS = FACTORY + textwrap.dedent('''

    _build_module = build


    def build():  # noqa: F811 - the module and its example inputs
        return _build_module(), (torch.randint(0, 50257, (2, 16)),)
''')


def _blocks(language: str) -> list[tuple[str, int, str]]:
    """(readme, line, code) of every fenced block in ``language``."""
    found = []
    for readme in READMES:
        text = readme.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append((readme.relative_to(ROOT).as_posix(), line, match.group(2)))
    return found


def _commands() -> list[tuple[str, list[str]]]:
    """Each distinct command once, named by every README line that shows it (the main job is in
    the root README and the package's: one run proves both, and it is among the slowest)."""
    where: dict[tuple[str, ...], list[str]] = {}
    for readme, line, code in _blocks("bash"):
        for offset, text in enumerate(code.splitlines(), start=1):
            command = text.split("#", 1)[0].strip()
            if not command or command in NOT_OURS:
                continue
            words = shlex.split(command)
            assert words[:2] == ["uv", "run"], f"{readme}:{line + offset}: {text}"
            where.setdefault(tuple(words[2:]), []).append(f"{readme}:{line + offset}")
    return [("+".join(places), list(words)) for words, places in where.items()]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The files the examples name, in the folder they run in."""
    (tmp_path / "mypackage").mkdir()
    (tmp_path / "mypackage" / "__init__.py").write_text("")
    (tmp_path / "mypackage" / "models.py").write_text(FACTORY_WITH_INPUTS)
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "model.py").write_text(FACTORY)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    torch.export.save(torch.export.export(mlp, (torch.randn(2, 8),)), str(tmp_path / "model.pt2"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_readmes_have_examples():
    commands = [words[0] for _, words in _commands()]
    assert commands.count("aot-pipeline") >= 10 and "aot-config" in commands
    assert len(_blocks("python")) >= 2


@pytest.mark.slow
@pytest.mark.parametrize(("where", "words"), _commands(), ids=[w for w, _ in _commands()])
def test_command_example_runs(scratch, capsys, where, words):
    if words[0] == "aot-pipeline":
        from aot_pipeline.cli import main
    else:
        assert words[0] == "aot-config", where
        from aot_config.cli import main
    code = main(words[1:])
    out, err = capsys.readouterr()
    assert code == 0, f"{where}: exit {code}\n{err[-2000:]}"
    assert out.strip(), where
    written = [words[i + 1] for i, word in enumerate(words) if word == "--output"]
    written += ["pareto.png"] if words[1] == "pareto" and not written else []
    for png in written:
        assert (scratch / png).read_bytes()[:4] == b"\x89PNG", where


@pytest.mark.slow
@pytest.mark.parametrize(("readme", "line", "code"), _blocks("python"),
                         ids=[f"{r}:{n}" for r, n, _ in _blocks("python")])
def test_python_example_runs(scratch, readme, line, code):
    torch._dynamo.reset()
    exec(compile(code, f"{readme}:{line}", "exec"), {"__name__": "__readme__"})
