"""Old import paths, kept working until 0.3: the flat layout (before 0.2) and the modules that
left ``fx/`` for their rooms (``memory_models/``, ``split/``, ``costs/``).

``import aot_partition.joint`` (and every other moved module) still works: a finder on
``sys.meta_path`` answers the old name with the module at its new home, after a
DeprecationWarning naming it. Each name is one module, not a copy: patching it patches both.
Names that left a module that stayed (``budget.caps.SimulatedPeak``) resolve through the
module's ``__getattr__`` (``moved_names``), with the same warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

_PACKAGE = __name__.rpartition(".")[0]

# old module (relative to the package) -> its new home
MOVED_MODULES: dict[str, str] = {
    # before 0.2: the flat layout
    "mincut": "core.mincut", "mincut_scipy": "core.mincut_scipy", "knapsack": "core.knapsack",
    "ilp_graph": "core.ilp_graph",
    "joint": "fx.joint", "classify": "fx.classify", "sizes": "fx.sizes", "_compat": "fx._compat",
    "extract": "fx.extract", "graph_modules": "fx.graph_modules", "network": "fx.network",
    "policy": "fx.policy", "collectives": "fx.collectives", "estimators": "costs.estimators",
    "roofline": "costs.roofline", "regions": "fx.regions", "checkpoint_split": "fx.checkpoint_split",
    "spmd": "costs.spmd", "memory": "memory_models.simulator", "prepare": "fx.prepare", "solve": "fx.solve",
    "passes": "fx.passes", "passes.cse": "fx.passes.cse", "passes.dce": "fx.passes.dce",
    "passes.recompute_tags": "fx.passes.recompute_tags", "passes.reorder": "fx.passes.reorder",
    "passes.rng": "fx.passes.rng", "passes.rng_ops": "fx.passes.rng_ops",
    "caps": "budget.caps", "reference": "budget.reference", "region_budget": "budget.regions",
    "pareto": "report.pareto", "draw": "report.draw", "memory_plot": "report.memory_plot",
    "trace": "report.trace",
    # before 0.3: fx/ held the memory models, the split and the cost estimators
    "fx.memory": "memory_models.simulator", "fx.inductor_memory": "memory_models.inductor",
    "fx.caching_allocator": "memory_models.caching_allocator",
    "fx.memory_models": "memory_models.pricing", "fx.symbolic_peak": "memory_models.symbolic_peak",
    "fx.shape_guards": "memory_models.shape_guards",
    "fx.token_split": "split.token_split", "fx.chunked_loss": "split.chunked_loss",
    "fx.chunked_mlp": "split.chunked_mlp",
    "fx.estimators": "costs.estimators", "fx.roofline": "costs.roofline", "fx.spmd": "costs.spmd",
}
_OLD_TO_NEW = {f"{_PACKAGE}.{old}": f"{_PACKAGE}.{new}" for old, new in MOVED_MODULES.items()}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _OLD_TO_NEW:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = _OLD_TO_NEW[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old import path goes away in "
                      f"aot-partition 0.3", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is the new one, already executed."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())


def moved_names(module: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that left ``module``: ``homes`` maps each name to its
    new module (relative to the package); the name is looked up there, after a
    DeprecationWarning naming both paths."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {_PACKAGE}.{home}.{name}; the old path goes "
                      f"away in aot-partition 0.3", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"{_PACKAGE}.{home}"), name)
    return __getattr__
