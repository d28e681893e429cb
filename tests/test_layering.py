"""Import layering of the workspace packages, read from the sources (no package is imported).

Every import counts, module-level or inside a function (a function-local import hides a cycle
from Python, not from the design), ``if TYPE_CHECKING:`` blocks included, and relative imports
are resolved (``from . import x`` imports the module ``x`` when it is one).

- No package may have an import cycle between its own modules.
- ``aot_partition`` follows an explicit table of layers: a module may import only modules of
  its own layer group or of lower layers (see ``AOT_PARTITION_LAYERS``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = sorted(p for p in (ROOT / "packages").glob("*/src/*")
                      if p.is_dir() and (p / "__init__.py").exists())


def _module_name(package_dir: Path, path: Path) -> str:
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(package_dir: Path) -> dict[str, Path]:
    """Module name -> source file, for every module of one package."""
    return {_module_name(package_dir, p): p for p in sorted(package_dir.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(name: str, path: Path, modules: set[str]) -> dict[str, int]:
    """The package's own modules that module ``name`` imports -> first line number."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        # ``import a.b.c`` also runs a and a.b; count the deepest module that exists.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}" if base else alias.name
                add(submodule if submodule in modules else base, node.lineno)
    return found


def import_graph(package_dir: Path) -> dict[str, dict[str, int]]:
    modules = package_modules(package_dir)
    names = set(modules)
    return {name: imports_of(name, path, names) for name, path in modules.items()}


def _ancestor_packages(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None.

    An edge from a module to a package ``__init__`` that contains it is ignored: importing
    ``pkg.sub`` always runs ``pkg/__init__.py`` first, and ``__init__`` re-exporting its
    submodules is the usual shape, not a cycle between layers.
    """
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if target in _ancestor_packages(node):
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} -> {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(steps)


@pytest.mark.parametrize("package_dir", PACKAGE_DIRS, ids=lambda p: p.name)
def test_no_import_cycle_inside_a_package(package_dir: Path) -> None:
    graph = import_graph(package_dir)
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)


# aot_partition, lowest layer first. A module may import modules of its own row and of the rows
# above it, never of a row below. Rows hold modules that do not import each other, or whose
# order inside the row is fixed by the cycle test.
AOT_PARTITION_LAYERS: list[tuple[str, ...]] = [
    # leaves: errors, flag access and the config snapshot (no torch)
    ("errors", "flags", "config", "_moved", "_fx_extra"),
    # core/: the graph-agnostic core on plain data (numpy/scipy only)
    ("core.milp_limits", "core.sparse_rows", "core.mincut", "core.mincut_small", "core.mincut_scipy",
     "core.knapsack", "core.graph", "core.ilp_graph", "core.offload_milp", "core.rules",
     "core.load", "core.timeline", "core.report", "core.cut_family", "core.budget", "core"),
    # fx/ leaves: torch-release differences, the joint graph's conventions, sizes, functional
    # collectives (they may import each other; the cycle test keeps them acyclic)
    ("fx", "fx._compat", "fx.graph_modules", "fx.joint", "fx.sizes", "fx.collectives",
     "fx.profiled_peak"),
    # split/'s ops: custom ops a compiler sees as one call (leaves the front end classifies),
    # and the compiled body of their chunks
    ("split", "split.chunk_body", "split.chunk_count", "split.chunked_loss", "split.chunked_mlp"),
    # split/: recognising a token-wise spike in a traced graph, rewritten into the ops
    ("split.token_split",),
    # costs/: what a node costs (roofline, estimators) and the ranks' agreement on it
    ("costs", "costs.roofline", "costs.spmd", "costs.estimators", "costs.cut_runtime"),
    # fx/passes: graph passes (one function each: graph in, "changed" out)
    ("fx.passes", "fx.passes.cse", "fx.passes.dce", "fx.passes.recompute_tags",
     "fx.passes.reorder", "fx.passes.rng", "fx.passes.rng_ops", "fx.passes.offload_ops"),
    # the joint prepared for partitioning (checks + passes, undone afterwards)
    ("fx.prepare",),
    # per-node classification, policy, the translation into the core, min-cut solve,
    # forward/backward cutting
    ("fx.classify", "fx.context", "fx.extract", "fx.policy", "fx.network", "fx.solve",
     "fx.regions"),
    # a cut's graphs as the partition finishes them; offload rewriting; default_partition of
    # checkpoint-tagged joints
    ("fx.cut", "fx.offload", "fx.checkpoint_split"),
    # memory_models/: what the program that runs allocates (unfused simulator, Inductor's
    # program, CUDA's caching allocator, peaks under dynamic shapes)
    ("memory_models", "memory_models.symbolic_peak", "memory_models.shape_guards",
     "memory_models.caching_allocator", "memory_models.simulator", "memory_models.inductor",
     "memory_models.pricing", "memory_models.lowering_memo", "memory_models.scalar_codegen",
     "memory_models.chunk_scratch"),
    # budget/: the memory-budget search
    ("budget", "budget.search"),
    # the candidate cuts a cap chooses among; the peak cap's measure
    ("budget.candidates", "budget.peak"),
    # budgets in bytes or a peak, per-region budgets, the reference check, the offload plan
    ("budget.caps", "budget.reference", "budget.regions", "budget.offload_plan"),
    # report/: data only: the partition report; pictures; TORCH_TRACE artifacts
    ("report", "report.report", "report.draw", "report.memory_plot", "report.trace"),
    # the budget sweep
    ("report.pareto",),
    # composition: the two partition functions and explain_partition
    ("partitioners",),
    # the public API
    ("",),
]


def _layer_of(module: str) -> int:
    short = module.removeprefix("aot_partition").removeprefix(".")
    for index, row in enumerate(AOT_PARTITION_LAYERS):
        if short in row:
            return index
    raise AssertionError(f"aot_partition module {module!r} is in no row of AOT_PARTITION_LAYERS; "
                         "add it to the layer it belongs to")


def test_aot_partition_imports_only_point_down() -> None:
    package_dir = ROOT / "packages" / "aot-partition" / "src" / "aot_partition"
    graph = import_graph(package_dir)
    upward = []
    for module, targets in sorted(graph.items()):
        for target, line in sorted(targets.items()):
            if target in _ancestor_packages(module):
                continue
            if _layer_of(target) > _layer_of(module):
                upward.append(f"{module} (line {line}) imports {target}, a higher layer")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_function_local_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text("from .sub import c\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b": 2}
    assert graph["pkg.b"] == {"pkg.sub.c": 1}
    assert graph["pkg.sub.c"] == {"pkg.a": 3}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]


def test_nothing_below_the_budget_search_imports_it():
    """The rooms below budget/ (core, fx, split, costs, memory_models) never import budget/,
    report/ or the partitioners: the arrow from fx/checkpoint_split.py to budget/caps.py was the
    last one that ran back up."""
    package_dir = ROOT / "packages" / "aot-partition" / "src" / "aot_partition"
    graph = import_graph(package_dir)
    lower = ("aot_partition.core", "aot_partition.fx", "aot_partition.split",
             "aot_partition.costs", "aot_partition.memory_models")
    upper = ("aot_partition.budget", "aot_partition.report", "aot_partition.partitioners")
    upward = [f"{module} (line {line}) imports {target}"
              for module, targets in sorted(graph.items())
              if module.startswith(lower)
              for target, line in sorted(targets.items()) if target.startswith(upper)]
    assert not upward, "\n".join(upward)
