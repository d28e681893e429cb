"""protocol.py is the only module of compiled_autograd that may tell torch releases apart.

Every other module codes against :class:`compiled_autograd.protocol.Protocol`. This test reads
the package's sources (nothing is imported or run) and fails on the ways a release check
usually sneaks in elsewhere: reading torch's version, probing torch for an attribute, guarding
an import against a missing torch internal, or comparing the protocol's release number instead
of asking it a named fact.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import compiled_autograd
import pytest

PACKAGE = Path(compiled_autograd.__file__).parent
ALLOWED = "protocol.py"
GUARD_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError"}
VERSION_NAMES = {"TorchVersion", "torch_version", "torch_release", "protocol_for"}


def _root_name(node: ast.AST) -> str | None:
    """``torch`` for ``torch._C._dynamo``: the name an attribute chain starts from."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _torch_bound_names(tree: ast.Module) -> set[str]:
    """``torch`` and every name the module binds by importing from torch."""
    names = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.asname for alias in node.names
                         if alias.asname and alias.name.split(".")[0] == "torch")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _caught(handler: ast.ExceptHandler) -> set[str]:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {kind.id if isinstance(kind, ast.Name) else getattr(kind, "attr", "")
            for kind in kinds if kind is not None}


def release_checks(source: str) -> list[str]:
    """Each release check in ``source``, as ``line: what``."""
    tree = ast.parse(source)
    torch_names = _torch_bound_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and node.attr in ("__version__", "version"):
            if node.attr == "__version__" or _root_name(node) in torch_names:
                found.append(f"{line}: reads {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and node.attr == "release":
            found.append(f"{line}: compares a release number ({ast.unparse(node)})")
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in VERSION_NAMES:
                found.append(f"{line}: uses {name}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                f"{node.module}.{a.name}" for a in node.names]
            for module in modules:
                if any(part in ("version", "torch_version", "__version__")
                       for part in module.split(".")):
                    found.append(f"{line}: imports {module}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id in ("hasattr", "getattr") and node.args
                and _root_name(node.args[0]) in torch_names):
            found.append(f"{line}: probes torch with {ast.unparse(node)}")
        elif isinstance(node, ast.Try):
            for handler in node.handlers:
                if _caught(handler) & GUARD_ERRORS:
                    found.append(f"{line}: guards code with except {sorted(_caught(handler))}")
    return found


@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py")
                                          if p.name != ALLOWED))
def test_only_protocol_tells_releases_apart(module):
    checks = release_checks((PACKAGE / module).read_text())
    assert not checks, (f"compiled_autograd/{module} tells torch releases apart; put the "
                        f"difference in {ALLOWED} and ask it there:\n" + "\n".join(checks))


def test_protocol_is_where_the_release_checks_are():
    # If protocol.py stopped reading the version, the rule above would be guarding nothing.
    assert release_checks((PACKAGE / ALLOWED).read_text())


@pytest.mark.parametrize("snippet", [
    "import torch\nif torch.__version__ >= '2.13': pass",
    "from torch.torch_version import TorchVersion",
    "import torch\nv = torch.version.cuda",
    "from torch import __version__",
    "import torch\nok = hasattr(torch._C._dynamo, 'compiled_autograd')",
    "from torch._functorch._aot_autograd import runtime_wrappers as rw\n"
    "f = getattr(rw, '_backward_prologue_functional', None)",
    "try:\n    from torch._foo import bar\nexcept ImportError:\n    bar = None",
    "try:\n    x = 1\nexcept (ValueError, ModuleNotFoundError):\n    pass",
    "from compiled_autograd import protocol\nnew = protocol.current().release >= (2, 13)",
    "from compiled_autograd.protocol import torch_release\nr = torch_release()",
    "from compiled_autograd import protocol\np = protocol.protocol_for()",
])
def test_each_kind_of_release_check_is_caught(snippet):
    assert release_checks(textwrap.dedent(snippet)), snippet


@pytest.mark.parametrize("snippet", [
    "aot = hasattr(ctx._forward_cls, '_aot_id')",  # a type check, not a release check
    "import sys\nconfig = sys.modules.get('torch._inductor.config')",
    "from compiled_autograd import protocol\nif protocol.current().aot_prologue_on_class: pass",
    "try:\n    x = 1\nexcept (TypeError, ValueError):\n    pass",
])
def test_ordinary_code_is_not_flagged(snippet):
    assert release_checks(textwrap.dedent(snippet)) == []
