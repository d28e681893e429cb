"""Each package builds alone and installs into a clean virtual environment with only its declared
dependencies, and the dependency direction config <- partition <- compilers <- pipeline holds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "aot-config": "aot_config",
    "aot-partition": "aot_partition",
    "aot-compilers": "aot_compilers",
    "compiled-autograd": "compiled_autograd",
    "aot-pipeline": "aot_pipeline",
}
# What each package may depend on, inside the workspace.
ALLOWED_WORKSPACE_DEPS = {
    "aot-config": set(),
    "aot-partition": {"aot-config"},
    "aot-compilers": {"aot-config", "aot-partition"},
    "compiled-autograd": {"aot-config"},
    "aot-pipeline": {"aot-config", "aot-partition", "aot-compilers", "compiled-autograd"},
}

uv = shutil.which("uv")
needs_uv = pytest.mark.skipif(uv is None, reason="uv is not on PATH")


def _declared(dist: str) -> set[str]:
    meta = tomllib.loads((ROOT / "packages" / dist / "pyproject.toml").read_text())
    names = set()
    for req in meta["project"]["dependencies"]:
        name = req.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        names.add(name.strip())
    return names


@pytest.mark.parametrize("dist", sorted(PACKAGES))
def test_dependencies_point_one_way(dist):
    workspace_deps = _declared(dist) & set(PACKAGES)
    assert workspace_deps <= ALLOWED_WORKSPACE_DEPS[dist], (
        f"{dist} depends on {sorted(workspace_deps - ALLOWED_WORKSPACE_DEPS[dist])}, "
        "against the direction config <- partition <- compilers <- pipeline")


@pytest.mark.parametrize("dist", sorted(PACKAGES))
def test_package_layout(dist):
    pkg = ROOT / "packages" / dist
    src = pkg / "src" / PACKAGES[dist]
    assert (src / "__init__.py").is_file()
    assert (src / "py.typed").is_file(), f"{dist} must ship py.typed"
    readme = (pkg / "README.md").read_text()
    assert len(readme.splitlines()) > 10, f"{dist}/README.md is a stub"
    version = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]["version"]
    assert version.count(".") == 2
    changelog = (pkg / "CHANGELOG.md").read_text()
    assert f"## {version}" in changelog, f"{dist}/CHANGELOG.md has no entry for {version}"


def _requirements(dist: str) -> list[Requirement]:
    meta = tomllib.loads((ROOT / "packages" / dist / "pyproject.toml").read_text())["project"]
    extras = [r for group in meta.get("optional-dependencies", {}).values() for r in group]
    return [Requirement(r) for r in [*meta["dependencies"], *extras]]


def _version(dist: str) -> str:
    meta = tomllib.loads((ROOT / "packages" / dist / "pyproject.toml").read_text())
    return meta["project"]["version"]


@pytest.mark.parametrize("dist", sorted(PACKAGES))
def test_siblings_are_pinned_to_versions_that_work_together(dist):
    """Each requirement on a sibling has a lower bound the sibling's version meets and an
    upper bound below its next minor version: a pip user gets versions released together."""
    for req in _requirements(dist):
        if req.name not in PACKAGES:
            continue
        sibling = Version(_version(req.name))
        lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
        upper = [Version(s.version) for s in req.specifier if s.operator == "<"]
        assert lower and upper, f"{dist}: {req} needs a >= and a < bound"
        assert sibling in req.specifier, f"{dist}: {req} excludes {req.name} {sibling}"
        assert upper[0] <= Version(f"{sibling.major}.{sibling.minor + 1}"), (
            f"{dist}: {req} admits {req.name} versions of a later minor series")


def test_partition_imports_without_compilers_autograd_or_pipeline():
    code = ("import sys, aot_partition; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'aot_compilers', 'compiled_autograd', 'aot_pipeline'}); print(bad); "
            "sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_config_imports_without_torch():
    code = ("import sys, aot_config; from aot_config import functorch, dynamo; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, "importing aot_config imported torch\n" + proc.stderr


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    for dist in PACKAGES:
        subprocess.run([uv, "build", "--quiet", "--package", dist, "--wheel", "-o", str(out)],
                       cwd=ROOT, check=True)
    return out


def _clean_venv_import(wheels: Path, tmp: Path, dist: str, code: str) -> subprocess.CompletedProcess:
    """``code`` run in a fresh venv with ``dist`` (a requirement: extras allowed) installed."""
    venv = tmp / f"venv-{dist.replace('[', '-').rstrip(']')}"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
    env["VIRTUAL_ENV"] = str(venv)
    # Only the wheel and its declared dependencies: workspace siblings come from the built wheels.
    subprocess.run([uv, "pip", "install", "--quiet", "--find-links", str(wheels), dist],
                   check=True, env=env, cwd=tmp)
    python = venv / "bin" / "python"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp, env=env)


@needs_uv
@pytest.mark.slow
def test_config_wheel_installs_alone_without_torch(wheels, tmp_path):
    proc = _clean_venv_import(
        wheels, tmp_path, "aot-config",
        "import importlib.util, aot_config.functorch as f; "
        "assert importlib.util.find_spec('torch') is None; print(f.activation_memory_budget)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1.0"


@needs_uv
@pytest.mark.slow
def test_partition_wheel_installs_alone_without_torch(wheels, tmp_path):
    # The core needs no torch: the plain install has none, and an fx name says which extra.
    proc = _clean_venv_import(
        wheels, tmp_path, "aot-partition",
        "import importlib.util, aot_partition\n"
        "from aot_partition.core import CoreGraph, CoreNode, partition_under_budget\n"
        "print([n for n in ('torch', 'aot_compilers', 'compiled_autograd', 'aot_pipeline') "
        "if importlib.util.find_spec(n)])\n"
        "graph = CoreGraph((CoreNode('x', nbytes=8, category='input', forward=True),\n"
        "    CoreNode('g', category='tangent', in_backward=True),\n"
        "    CoreNode('gx', ('g', 'x'), nbytes=8, in_backward=True, backward=True)))\n"
        "print(partition_under_budget(graph, fraction=0.5).saved)\n"
        "try:\n"
        "    aot_partition.min_cut_rematerialization_partition\n"
        "except ImportError as error:\n"
        "    print('[fx]' in str(error))\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "('x',)", "True"]


@needs_uv
@pytest.mark.slow
def test_partition_wheel_with_the_fx_extra_installs_alone(wheels, tmp_path):
    proc = _clean_venv_import(
        wheels, tmp_path, "aot-partition[fx]",
        "import importlib.util, aot_partition; "
        "print([n for n in ('aot_compilers', 'compiled_autograd', 'aot_pipeline') "
        "if importlib.util.find_spec(n)]); "
        "print(callable(aot_partition.min_cut_rematerialization_partition))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]


@needs_uv
@pytest.mark.slow
def test_pipeline_wheel_installs_with_its_siblings(wheels, tmp_path):
    proc = _clean_venv_import(
        wheels, tmp_path, "aot-pipeline",
        "import aot_pipeline, aot_compilers, compiled_autograd, aot_partition, aot_config; print('ok')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# ---- the READMEs' install path: the packages are on no index (issue 52, item 8) -------------

INSTALL_STEPS = ("uv build --all-packages -o dist", "--find-links dist")
READMES = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.parent.name if p.parent != ROOT
                         else "root")
def test_each_readme_says_how_to_install_from_built_wheels(readme):
    # `pip install aot-partition` from an index finds nothing, and its wheel alone does not
    # resolve (aot-config is no index's either): each README gives the way that works.
    text = readme.read_text()
    missing = [step for step in INSTALL_STEPS if step not in text]
    assert not missing, f"{readme.relative_to(ROOT)} does not say {missing}"


@needs_uv
def test_the_core_installs_from_the_wheels_the_readmes_build(tmp_path):
    """The READMEs' commands as written, in a scratch folder: ``uv build --all-packages -o
    dist`` from the workspace, then aot-partition (its core: torch would take minutes to
    install) with ``--find-links dist`` into a fresh venv, by uv's pip (numpy, scipy and
    networkx from uv's cache or the index; aot-config only from dist)."""
    build = INSTALL_STEPS[0].split()
    subprocess.run([uv, *build[1:-1], str(tmp_path / build[-1]), "--quiet"], cwd=ROOT,
                   check=True)
    wheels = tmp_path / "dist"
    assert sorted(p.name.split("-")[0] for p in wheels.glob("*.whl")) == sorted(
        name.replace("-", "_") for name in PACKAGES)
    proc = _clean_venv_import(
        wheels, tmp_path, "aot-partition",
        "import sys, aot_partition.core as core\n"
        "graph = core.CoreGraph((core.CoreNode('x', nbytes=8, category='input', forward=True),\n"
        "    core.CoreNode('g', category='tangent', in_backward=True),\n"
        "    core.CoreNode('gx', ('g', 'x'), nbytes=8, in_backward=True, backward=True)))\n"
        "print(core.partition(graph).saved, 'torch' in sys.modules)\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["('x',)", "False"]
