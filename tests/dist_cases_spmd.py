"""Rank-side functions of tests/aot_partition/test_distributed_decisions.py (issue 26).

Each runs on every rank of ``ranks.run_ranks`` (gloo, CPU) and returns plain data: the test
process compares the ranks' answers. Several variants run in one call (starting ranks costs
about 10 s of imports on this machine).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from aot_config import functorch as functorch_config
from aot_partition import PartitionDisagreementError
from aot_partition.config import PartitionConfig
from aot_partition.costs import estimators, spmd
from aot_partition.partitioners import partition_with_report
from functorch.compile import aot_function, nop

# ---- a block calling functional collectives ---------------------------------------------------

def collective_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A cheap input feeding all_gather, then all_reduce, then reduce_scatter (3 collectives, 3
    waits in the joint graph): at budget 0.0 torch's partitioner recomputes all 6."""
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    h = torch.sin(x) * 2
    # all_gather_single is all_gather_tensor's newer name (the old one warns from torch 2.13)
    all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    gathered = all_gather(h, 0, group)
    reduced = funcol.all_reduce(gathered, "sum", group)
    scattered = funcol.reduce_scatter_tensor(torch.relu(reduced) @ w, "sum", 0, group)
    return scattered.sin().sum()


def _collective_names(graph: torch.fx.Graph) -> set[str]:
    return {n.name for n in graph.nodes if n.op == "call_function"
            and getattr(n.target, "namespace", None) == "_c10d_functional"}


def _run_block(partition_fn: Any, seed: int = 0) -> dict[str, Any]:
    """Forward+backward of ``collective_block`` through ``partition_fn`` and nop compilers:
    the forward's collectives that the backward recomputes, the saved values, the grads."""
    seen: dict[str, Any] = {}

    def partition(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        fw, bw = partition_fn(joint, inputs, **kwargs)
        forward_collectives = _collective_names(fw.graph)
        seen["recomputed"] = sorted(n.name for n in bw.graph.nodes
                                    if n.op == "call_function" and n.name in forward_collectives)
        seen["saved"] = [n.name for n in bw.graph.find_nodes(op="placeholder")]
        return fw, bw

    torch.manual_seed(seed)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    aot_function(collective_block, nop, nop, partition_fn=partition)(x, w).backward()
    assert x.grad is not None and w.grad is not None
    seen["grads"] = [x.grad.clone(), w.grad.clone()]
    return seen


def _ours(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
    fw, bw, report = partition_with_report(
        joint, num_fwd_outputs=kwargs["num_fwd_outputs"],
        static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))
    _ours.banned = report.banned  # type: ignore[attr-defined]
    return fw, bw


def functional_collectives(budgets: tuple[float, ...] = (1.0, 0.5, 0.0)) -> dict[str, Any]:
    """Ours at each budget with the "dp" and "ilp_graph" solvers (fingerprint check on), the
    allow flag at 0.0, and torch's partitioner at 0.0."""
    from torch._functorch import config as torch_functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition as torch_mincut

    torch.manual_seed(0)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    collective_block(x, w).backward()
    assert x.grad is not None and w.grad is not None
    eager = [x.grad, w.grad]

    results: dict[str, Any] = {"ours": {}}
    for budget in budgets:
        for solver in ("dp", "ilp_graph"):
            with functorch_config.patch(activation_memory_budget=budget,
                                        activation_memory_budget_solver=solver,
                                        check_partition_agreement=True):
                seen = _run_block(_ours)
            results["ours"][f"{budget} {solver}"] = {
                "recomputed": seen["recomputed"], "saved": seen["saved"],
                "grads_match": all(torch.allclose(a, b, atol=1e-5)
                                   for a, b in zip(seen["grads"], eager))}
    results["collective_reasons"] = sorted(
        {why for why in _ours.banned.values() if why.startswith("collective")})  # type: ignore[attr-defined]
    with functorch_config.patch(activation_memory_budget=0.0, allow_recompute_collectives=True):
        results["ours allowed 0.0"] = _run_block(_ours)["recomputed"]
    with torch_functorch_config.patch(activation_memory_budget=0.0):
        results["torch 0.0"] = _run_block(torch_mincut)["recomputed"]
    return results


# ---- measured runtimes that differ between ranks ---------------------------------------------

def mlp(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    """Residual blocks whose up-projection is 4x wider: the budget's knapsack chooses which
    matmuls to recompute by their runtimes."""
    h = x
    for up, down in zip(weights[::2], weights[1::2]):
        h = h + torch.relu(h @ up) @ down
    return h.sum()


def _rank_dependent_profile(node: torch.fx.Node) -> float:
    """A fake measurement that depends on the rank: on rank 0 an op's time grows with the
    square of its output's size, on the others every op takes 1 ms."""
    return float(node.meta["val"].numel() ** 2) if dist.get_rank() == 0 else 1.0


def _partition_mlp(hidden: int = 128, **flags: Any) -> list[str]:
    """The saved values (as the report lists them) of ``mlp``'s partition at budget 0.5 with
    the 'profile' estimator."""
    saved: list[str] = []

    def partition(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        fw, bw, report = partition_with_report(
            joint, num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))
        saved.extend(d.name for d in report.saved)
        return fw, bw

    estimators.clear_runtime_cache()
    torch.manual_seed(0)
    x = torch.randn(16, 32, requires_grad=True)
    weights = [torch.randn(*((32, hidden) if i % 2 == 0 else (hidden, 32)), requires_grad=True)
               for i in range(8)]
    with functorch_config.patch(activation_memory_budget=0.5,
                                activation_memory_budget_runtime_estimator="profile",
                                activation_memory_budget_reference_estimator=None, **flags):
        aot_function(mlp, nop, nop, partition_fn=partition)(x, *weights).backward()
    return saved


def _error_of(hidden: int = 128, **flags: Any) -> str | None:
    try:
        _partition_mlp(hidden, **flags)
    except PartitionDisagreementError as exc:
        return str(exc)
    return None


def rank_dependent_profiles() -> dict[str, Any]:
    """The partition of one MLP under rank-dependent 'profile' times: with the agreement (the
    default), without it, and the fingerprint check in both cases."""
    original = estimators._MEASURES["profile"]
    estimators._MEASURES["profile"] = _rank_dependent_profile
    try:
        return {
            "agreed": _partition_mlp(),
            "not agreed": _partition_mlp(agree_partition_across_ranks=False),
            "check, agreed": _error_of(check_partition_agreement=True),
            "check, not agreed": _error_of(check_partition_agreement=True,
                                           agree_partition_across_ranks=False),
            # ranks that compile different graphs cannot agree on their times
            "different graphs": _error_of(hidden=128 - 64 * dist.get_rank()),
        }
    finally:
        estimators._MEASURES["profile"] = original
        estimators.clear_runtime_cache()


# ---- DDP and FSDP2 under torch.compile(backend="aot_pipeline") --------------------------------

class Block(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(torch.nn.Module):
    def __init__(self, dim: int = 16, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(blocks))
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _eager_grads(seed: int, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model on one process, eager, over every rank's batch: DDP and FSDP2 average the
    ranks' gradients, which are these."""
    torch.manual_seed(seed)
    model = Stack()
    (sum(model(x).pow(2).mean() for x in batches) / len(batches)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _max_grad_error(model: torch.nn.Module, eager: dict[str, torch.Tensor]) -> float:
    worst = 0.0
    for name, p in model.named_parameters():
        name = name.removeprefix("module.").replace("_orig_mod.", "")
        grad = p.grad
        assert grad is not None, name
        if hasattr(grad, "full_tensor"):  # FSDP2: a sharded DTensor
            grad = grad.full_tensor()
        worst = max(worst, float((grad - eager[name]).abs().max()))
    return worst


def _count_agreements() -> Any:
    """Count the agreements of 'profile' times (spmd.agree_on_profile_times) from now on."""
    original = spmd.agree_on_profile_times

    def counted(*args: Any, **kwargs: Any) -> Any:
        counted.calls += 1  # type: ignore[attr-defined]
        return original(*args, **kwargs)

    counted.calls = 0  # type: ignore[attr-defined]
    counted.original = original  # type: ignore[attr-defined]
    spmd.agree_on_profile_times = counted
    return counted


def _graphs_compiled() -> int:
    """Graphs AOTAutograd compiled (the DDP optimizer's split counts each piece)."""
    from torch._dynamo.utils import counters

    return int(counters["aot_autograd"]["total"])


def _step(variant: dict[str, Any], model: torch.nn.Module, x: torch.Tensor
          ) -> torch.nn.Module:
    """One compiled forward+backward of ``model`` wrapped as ``variant`` says; the wrapper."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    options = {"compiler": variant["compiler"], "memory_budget": variant["budget"]}
    if variant["wrap"] == "ddp+compiled_autograd":
        import aot_pipeline

        # compiled autograd sees DDP's gradient hooks only through the python reducer
        torch._dynamo.config.optimize_ddp = "python_reducer"
        try:
            wrapped: torch.nn.Module = DistributedDataParallel(model)
            compiled = aot_pipeline.compile(wrapped, memory_budget=variant["budget"],
                                            compiler=variant["compiler"],
                                            compiled_autograd=True)
            compiled.backward(compiled(x).pow(2).mean())
        finally:
            torch._dynamo.config.optimize_ddp = True
        return wrapped
    if variant["wrap"] == "ddp":
        # tiny buckets (the first one no bigger, as Dynamo's DDP optimizer requires): it splits
        # the graph at bucket boundaries
        dist._DEFAULT_FIRST_BUCKET_BYTES = 4000  # type: ignore[attr-defined]
        wrapped = DistributedDataParallel(model, bucket_cap_mb=0.004)
        runner = torch.compile(wrapped, backend="aot_pipeline", options=options)
    else:
        for block in model.blocks:
            fully_shard(block)
            block.compile(backend="aot_pipeline", options=options)
        wrapped = runner = fully_shard(model)
    runner(x).pow(2).mean().backward()
    return wrapped


def training(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant ({"wrap": "ddp" | "fsdp2" | "ddp+compiled_autograd", "budget": float,
    "compiler": "nop" | "inductor", optionally "flags": aot_config.functorch flags to patch}):
    one forward+backward compiled with backend="aot_pipeline"; its largest gradient error
    against eager, how many graphs AOTAutograd compiled, how many agreements of 'profile'
    times ran, and the seconds."""
    from torch._dynamo.utils import counters

    torch.manual_seed(1234)  # a different batch on each rank: the gradients must be averaged
    batches = [torch.randn(4, 8, 16) for _ in range(dist.get_world_size())]
    x = batches[dist.get_rank()]
    eager = _eager_grads(0, batches)
    results = []
    for variant in variants:
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        start = time.perf_counter()
        agreed = _count_agreements()
        try:
            with functorch_config.patch(**variant.get("flags", {})):
                wrapped = _step(variant, Stack(), x)
        finally:
            spmd.agree_on_profile_times = agreed.original  # type: ignore[attr-defined]
        results.append({**variant, "max_grad_error": _max_grad_error(wrapped, eager),
                        "graphs": _graphs_compiled(), "seconds": time.perf_counter() - start,
                        "profile agreements": agreed.calls})
    return results


def decisions() -> dict[str, Any]:
    """Both groups of partition cases above, in one start of the ranks."""
    return {"collectives": functional_collectives(), "profiles": rank_dependent_profiles()}


# ---- back-to-back collectives while torch compiles ----------------------------------------------

def _unguarded_real_kernels() -> Any:
    """aot_partition's real_kernels as it was before the deadlock fix: modes set aside and the
    Python key off, the Python dispatcher left on."""
    import contextlib

    from torch.utils._mode_utils import no_dispatch
    from torch.utils._python_dispatch import _disable_current_modes

    @contextlib.contextmanager
    def unguarded() -> Any:
        with _disable_current_modes(), no_dispatch():
            yield

    return unguarded


def collective_free_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w).sum()


def back_to_back_agreements(rounds: int, guarded: bool = True) -> int:
    """``rounds`` agreements of 'profile' times and checks of the saved set, back to back under
    the Python dispatcher, which Dynamo and AOTAutograd turn on while the partitioner runs
    (three all-reduces a round, nothing between them: the times come from a cache). With
    ``guarded=False`` the collectives run as they did before the fix. The rounds done. The
    timed part starts at the loop (``ranks.mark_ready``) and each round reports its count
    (``ranks.report_progress``), so a run is judged by its state: stalled or counting."""
    from aot_partition.fx import _compat
    from ranks import mark_ready, report_progress
    from torch._dispatch.python import enable_python_dispatcher

    graph = torch.fx.symbolic_trace(collective_free_block).graph
    ops = [node for node in graph.nodes if node.op == "call_function"]
    config = PartitionConfig(check_agreement=True)
    original = _compat.real_kernels
    if not guarded:
        _compat.real_kernels = _unguarded_real_kernels()
    try:
        with enable_python_dispatcher():
            mark_ready()
            for done in range(rounds):
                spmd.agree_on_profile_times(graph, lambda node: 1.0, lambda node: node.name)
                spmd.check_saved_agreement(ops, config)
                report_progress(done + 1)
    finally:
        _compat.real_kernels = original
    return rounds


# ---- caches that skip partitioning on some ranks only ----------------------------------------

def caches_warm_on_one_rank(flag_sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per set of ``flags``: two compiles of ``Stack`` with Inductor at budget 0.5 under them,
    each rank with its own cache folder (as on separate machines); between them rank 1's
    folder is emptied, so the second compile finds rank 0's caches warm and rank 1's cold.
    AOTAutograd's cache counters of both compiles, and the largest gradient error of the second
    against eager."""
    import os
    import shutil
    import tempfile

    import aot_pipeline
    from torch._dynamo.utils import counters

    rank = dist.get_rank()
    torch.manual_seed(rank)
    x = torch.randn(4, 8, 16)
    eager = _eager_grads(0, [x])

    def compile_and_step() -> tuple[dict[str, int], torch.nn.Module]:
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = Stack()
        compiled = torch.compile(model, backend=aot_pipeline.make_backend({"memory_budget": 0.5}))
        compiled(x).pow(2).mean().backward()
        return {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}, model

    results = []
    for flags in flag_sets:
        cache = tempfile.mkdtemp(prefix=f"aot-inductor-rank{rank}-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            with functorch_config.patch(**flags):
                first, _ = compile_and_step()
                if rank == 1:
                    shutil.rmtree(cache)
                    os.makedirs(cache)
                dist.barrier()
                second, model = compile_and_step()
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        results.append({"first": first, "second": second,
                        "max_grad_error": _max_grad_error(model, eager)})
    return results
