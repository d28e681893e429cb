"""Errors raised by the partitioners; each names the culprit and what would be valid."""

from __future__ import annotations

from typing import Any


class PartitionError(RuntimeError):
    """Base class for every error the partitioners raise on bad joint graphs."""


class MissingMetadataError(PartitionError):
    """A joint-graph node lacks ``meta["val"]`` (fake-tensor metadata)."""

    def __init__(self, node_name: str, target: str) -> None:
        self.node_name = node_name
        super().__init__(
            f"joint-graph node '{node_name}' ({target}) has no meta['val']; the partitioner "
            "needs fake-tensor metadata on every node to size activations. Trace the joint "
            "graph with aot_function/aot_module or make_fx(tracing_mode='fake')."
        )


class InfeasibleMinCutError(PartitionError):
    """Some value must reach the backward, yet can be neither saved nor recomputed."""

    # What to change, in the fx front end's words (the core passes its own: CORE_HINT).
    FX_HINT = ("Make one node on this path saveable (a tensor with meta['val']) or recomputable "
               "(drop its ban or MUST_SAVE/MUST_RECOMPUTE annotation).")
    CORE_HINT = ("Make one node on this path saveable (a value with a finite save cost, not "
                 "opaque) or recomputable (release its ban or drop its must-recompute mark).")

    def __init__(self, path: list[tuple[str, str]], hint: str | None = None) -> None:
        # ``path``: one (node name or "sink", why this edge is infinite) per edge, from the
        # source on; a node appears twice when both its in- and out-half are on the path.
        self.path = path
        steps = "\n".join(f"  {name}: {why}" for name, why in path)
        names = ["source"] + [name for name, _ in path]
        chain = " -> ".join(n for i, n in enumerate(names) if i == 0 or n != names[i - 1])
        super().__init__(
            "min-cut partitioning is infeasible: a value needed by the backward can be "
            "neither saved nor recomputed. Offending path of infinite-capacity edges:\n"
            f"  {chain}\n{steps}\n" + (hint if hint is not None else self.FX_HINT)
        )


class GraphCycleError(PartitionError):
    """A joint-graph node reads a value computed after it: the graph has a cycle (or is out
    of topological order)."""

    def __init__(self, node_name: str, input_name: str, cycle: list[str] | None) -> None:
        self.node_name, self.input_name, self.cycle = node_name, input_name, cycle
        if cycle:
            what = f"the joint graph has a cycle: {' -> '.join(cycle)}"
        else:
            what = "the joint graph is not in topological order"
        super().__init__(
            f"{what} (node '{node_name}' reads '{input_name}', which comes after it). A "
            "joint graph must be acyclic, each node after its inputs, as fx traces it."
        )


class UnreachableMemoryBudgetError(ValueError):
    """No candidate cut fits a memory cap given in bytes (``activation_memory_budget_bytes``).

    A ValueError: the cap asked for is the bad value; the message names the least reachable.
    """

    def __init__(self, what: str, cap: int, least: int, least_label: str,
                 verb: str = "save") -> None:
        self.what, self.cap, self.least, self.least_label = what, cap, least, least_label
        self.verb = verb
        super().__init__(
            f"{what} {cap} bytes is unreachable: the least this graph can {verb} is "
            f"{least} bytes ({least_label})"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (a worker process's error)
        return (type(self), (self.what, self.cap, self.least, self.least_label, self.verb))


class FlagConflictError(ValueError):
    """torch's ``torch._functorch.config`` flag and ours (``aot_config.functorch``) of the same
    name are both set, to different values, or torch's holds a value ours cannot take."""

    def __init__(self, name: str, torch_value: object, our_value: object,
                 problem: str | None = None) -> None:
        self.name, self.torch_value, self.our_value = name, torch_value, our_value
        self.problem = problem
        if problem is None:
            problem = ("both are set and they differ; set one of them only (or both to the "
                       "same value)")
        super().__init__(
            f"torch._functorch.config.{name} = {torch_value!r} and "
            f"aot_config.functorch.{name} = {our_value!r}: {problem}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.torch_value, self.our_value, self.problem))


class PartitionDisagreementError(PartitionError):
    """Many ranks (costs/spmd.py): the ranks' partitions of one graph differ
    (``check_partition_agreement``), or ranks compile different graphs; every rank raises it."""
