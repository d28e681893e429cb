"""The docs stay short and cannot go stale: each package README is a reference a newcomer reads
in ten minutes (under 350 lines), and ARCHITECTURE.md names every folder of aot_partition."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_READMES = sorted((ROOT / "packages").glob("*/README.md"))
MAX_README_LINES = 350
PARTITION_SRC = ROOT / "packages" / "aot-partition" / "src" / "aot_partition"


def _package_folders(src: Path) -> list[str]:
    """Every folder of a source tree that holds Python, as ``a/b/`` relative to it."""
    return sorted(f"{d.relative_to(src).as_posix()}/" for d in src.rglob("*")
                  if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")))


def test_every_package_has_a_readme():
    assert len(PACKAGE_READMES) == 5, PACKAGE_READMES


@pytest.mark.parametrize("readme", PACKAGE_READMES, ids=lambda p: p.parent.name)
def test_package_readme_is_short(readme: Path):
    lines = len(readme.read_text().splitlines())
    assert lines < MAX_README_LINES, (
        f"{readme.relative_to(ROOT)} has {lines} lines; a package README is the reference "
        f"(API, flags, errors, examples) in under {MAX_README_LINES}: move history to "
        "benchmarks/ or git")


def test_architecture_names_every_folder_of_aot_partition():
    architecture = ROOT / "ARCHITECTURE.md"
    assert architecture.is_file(), "ARCHITECTURE.md is missing at the repository root"
    text = architecture.read_text()
    folders = _package_folders(PARTITION_SRC)
    assert {"core/", "fx/", "budget/", "report/", "fx/passes/"} <= set(folders), folders
    missing = [folder for folder in folders if folder not in text]
    assert not missing, f"ARCHITECTURE.md does not name these folders of aot_partition: {missing}"


def test_root_readme_links_architecture():
    assert "(ARCHITECTURE.md)" in (ROOT / "README.md").read_text()


def test_the_folder_check_fires_on_a_new_folder(tmp_path: Path):
    """The check above must notice a folder the text does not name (and only that one)."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "graph.py").write_text("")
    (tmp_path / "newfolder").mkdir()
    (tmp_path / "newfolder" / "x.py").write_text("")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "data").mkdir()  # no Python: not a package folder
    assert _package_folders(tmp_path) == ["core/", "newfolder/"]
    text = "core/ is described here"
    assert [f for f in _package_folders(tmp_path) if f not in text] == ["newfolder/"]
