"""Tensor parallel (DTensor) and FSDP2 + TP: opaque objects (a DTensor's ``DeviceMesh``) in the
joint graph, at every budget.

Unit tests (no ranks): an opaque object is never sized, always reaches the backward that reads
it, and is saved in AOTAutograd's opaque group (after the saved tensors and RNG states, before
the symbolic scalars), on a joint with an opaque input added by hand and on a DTensor joint
(one process, fake 2-rank group) against torch's partitioner. Real ranks (gloo, tests/ranks.py,
each run under a timeout; bodies in tests/dist_cases_tp.py): gradients equal an eager replica's
over 3 SGD steps at budgets 1.0, 0.5 and 0.0.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from aot_partition import default_partition, node_nbytes
from aot_partition.fx.sizes import is_opaque, is_opaque_value
from aot_partition.partitioners import partition_with_report
from dist_cases_tp import TO_LOCAL_VIEW_BUG
from ranks import run_ranks
from torch.fx.experimental._backward_state import BackwardState

# fp32, a few small matmuls and three SGD steps: eager and compiled differ by rounding only.
GRAD_TOLERANCE = 1e-4
TORCH_VERSION = tuple(int(part) for part in torch.__version__.split(".")[:2])


class FakeMesh:
    """Stands for a DeviceMesh or any script object: an opaque ``meta['val']``."""


# ---- the rule, on values --------------------------------------------------------------------

def test_opaque_values_are_what_is_neither_tensor_scalar_tuple_nor_backward_state():
    assert is_opaque_value(FakeMesh())
    for plain in (torch.ones(2), 3, 2.0, True, None, (torch.ones(1),), [torch.ones(1)],
                  BackwardState()):
        assert not is_opaque_value(plain), plain


def test_an_opaque_node_is_sized_zero_bytes():
    graph = fx.Graph()
    mesh = graph.placeholder("primals_mesh")
    mesh.meta["val"] = FakeMesh()
    assert node_nbytes(mesh) == 0 and is_opaque(mesh)


# ---- a joint with an opaque input, by hand ---------------------------------------------------

def _dropout_mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    hidden = torch.nn.functional.dropout(torch.relu(x @ w), 0.5, training=True)
    return (hidden @ w).sin()


@pytest.fixture(scope="module")
def dropout_joint(capture):
    torch.manual_seed(0)
    return capture(_dropout_mlp, torch.randn(4, 8, requires_grad=True),
                   torch.randn(8, 8, requires_grad=True))


def _with_opaque_input(joint: fx.GraphModule, returned: bool) -> fx.Graph:
    """A new last primal holding an opaque object; ``returned``: the backward returns it as
    that input's "gradient", as a DTensor gradient's mesh is returned."""
    graph = joint.graph
    primals = [n for n in graph.find_nodes(op="placeholder") if "primals" in n.name]
    with graph.inserting_after(primals[-1]):
        mesh = graph.placeholder("primals_mesh")
    mesh.meta["val"] = FakeMesh()
    output = next(iter(graph.find_nodes(op="output")))
    output.args = ((*output.args[0], mesh if returned else None),)
    output.meta.pop("desc", None)
    joint.recompile()
    return graph


def _outputs(module: fx.GraphModule) -> list:
    return list(next(iter(module.graph.find_nodes(op="output"))).args[0])


def _names(nodes) -> list:
    return [n.name if isinstance(n, fx.Node) else n for n in nodes]


@pytest.mark.parametrize("budget, solver", [(1.0, "dp"), (0.5, "dp"), (0.5, "ilp_graph"),
                                            (0.0, "dp")])
def test_an_opaque_input_the_backward_returns_is_saved_last(dropout_joint, budget, solver):
    from aot_config import functorch as flags

    joint = dropout_joint.fresh()
    _with_opaque_input(joint, returned=True)
    with flags.patch(activation_memory_budget_solver=solver):
        forward, backward, report = partition_with_report(
            joint, num_fwd_outputs=dropout_joint.num_fwd_outputs, memory_budget=budget)
    saved = _outputs(forward)[dropout_joint.num_fwd_outputs:]
    # No symbolic scalars here: the opaque group is last, after every tensor (RNG states too).
    assert _names(saved)[-1] == "primals_mesh"
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in saved[:-1])
    inputs = list(backward.graph.find_nodes(op="placeholder"))
    assert _names(inputs)[-2:] == ["primals_mesh", "tangents_1"]
    assert "primals_mesh" in _names(_outputs(backward))
    if budget == 0.0:  # the dropout is recomputed: its RNG state comes before the mesh
        assert report.notes and _names(inputs)[-3].startswith("rng_state_output_")
    decision = next(d for d in report.saved if d.name == "primals_mesh")
    assert decision.nbytes == 0 and decision.reason.startswith("opaque object")


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_an_opaque_input_the_backward_does_not_read_is_not_saved(dropout_joint, budget):
    joint = dropout_joint.fresh()
    _with_opaque_input(joint, returned=False)
    forward, backward, _ = partition_with_report(
        joint, num_fwd_outputs=dropout_joint.num_fwd_outputs, memory_budget=budget)
    assert "primals_mesh" not in _names(_outputs(forward))
    assert "primals_mesh" not in _names(backward.graph.find_nodes(op="placeholder"))


def test_default_partition_saves_an_opaque_input_last(dropout_joint):
    joint = dropout_joint.fresh()
    _with_opaque_input(joint, returned=True)
    forward, backward = default_partition(joint, None,
                                          num_fwd_outputs=dropout_joint.num_fwd_outputs)
    assert _names(_outputs(forward))[-1] == "primals_mesh"
    assert _names(backward.graph.find_nodes(op="placeholder"))[-2:] == ["primals_mesh",
                                                                       "tangents_1"]


# ---- a DTensor joint, one process, against torch's partitioner ------------------------------

def test_dtensor_joint_saves_the_mesh_in_the_group_torch_does():
    found = run_ranks("dist_cases_tp:dtensor_saved_groups", world_size=1,
                      kwargs={"budgets": [1.0, 0.5, 0.0]}, timeout=240)[0]
    if not found["torch 1.0"]["opaque_inputs"]:
        pytest.skip("this torch passes a DTensor's mesh into no graph (2.11)")
    for name, layout in found.items():
        kinds = layout["kinds"]
        # tensors, then the opaque objects, then the symbolic scalars
        assert kinds == sorted(kinds, key=["tensor", "opaque", "symbolic"].index), name
        assert layout["opaque"] == found["torch 1.0"]["opaque"], name


# ---- real ranks -----------------------------------------------------------------------------

def _check(results: list[dict], variants: list[dict]) -> dict[str, dict]:
    """Every rank ran every variant and got eager's gradients; rank 0's results by variant."""
    for rank, by_variant in enumerate(results):
        for key, value in by_variant.items():
            assert isinstance(value, dict), f"rank {rank}, {key} raised:\n{value}"
            assert value["grad"] <= GRAD_TOLERANCE, (rank, key, value)
    assert len(results[0]) == len(variants)
    return results[0]


def _recomputes_at_zero(by_variant: dict[str, dict], strictly: bool = True, **fixed) -> None:
    """Budget 0.0 saved fewer activation bytes than 1.0: the budget was exercised (or, with
    ``strictly`` off, no more: never more memory at a lower budget)."""
    suffix = "".join(f", {k}={v}" for k, v in fixed.items())
    full = by_variant[f"budget=1.0, compiler=nop{suffix}"]["saved"]
    none = by_variant[f"budget=0.0, compiler=nop{suffix}"]["saved"]
    assert full and (sum(none) < sum(full) if strictly else sum(none) <= sum(full)), (
        fixed, full, none)


@pytest.mark.slow
def test_tensor_parallel_mlps_match_eager_at_every_budget():
    # Inductor runs on DTensor graphs in the FSDP2 + TP test (one Inductor run per file: slow
    # on 2 cores).
    variants = [{"budget": b, "compiler": "nop"} for b in (1.0, 0.5, 0.0)]
    results = run_ranks("dist_cases_tp:tensor_parallel_mlps", world_size=2,
                        kwargs={"variants": variants}, timeout=240)
    # Each MLP ends in the row-wise all-reduce: what 0.0 could recompute beyond 1.0's cut sits
    # behind a collective, which is never recomputed, so 0.0 saves the same (and never more:
    # it once saved 1,472 bytes against 1.0's 1,408).
    _recomputes_at_zero(_check(results, variants), strictly=False)


# With and without sequence parallel, selective activation checkpointing on top of it. Under
# SAC the checkpoint annotations decide the cut (the budget then changes nothing), so its
# budgets are 0.0 with nop and 0.5 with Inductor; Inductor also at 1.0 and 0.0 without them.
# One 4-rank run, each block compiled apart; the Inductor variants first (torch 2.13 fails an
# Inductor compile of this block after several nop ones: see the README).
FSDP_TP_VARIANTS = [
    {"budget": 0.5, "compiler": "inductor", "sequence_parallel": True, "checkpoint": True},
    *({"budget": b, "compiler": "inductor", "sequence_parallel": False, "checkpoint": False}
      for b in (1.0, 0.0)),
    *({"budget": b, "compiler": "nop", "sequence_parallel": sp, "checkpoint": False}
      for sp in (False, True) for b in (1.0, 0.5, 0.0)),
    {"budget": 0.0, "compiler": "nop", "sequence_parallel": True, "checkpoint": True},
]


@pytest.mark.slow
def test_fsdp2_tp_llama_matches_eager_at_every_budget():
    results = run_ranks("dist_cases_tp:fsdp_tp_llama", world_size=4,
                        kwargs={"variants": FSDP_TP_VARIANTS}, timeout=600)
    by_variant = _check(results, FSDP_TP_VARIANTS)
    for sequence_parallel in (False, True):
        _recomputes_at_zero(by_variant, sequence_parallel=sequence_parallel, checkpoint=False)


@pytest.mark.slow
@pytest.mark.xfail(TORCH_VERSION >= (2, 12), strict=True, reason=TO_LOCAL_VIEW_BUG)
def test_torch_aot_eager_block_reading_to_local_view():
    """Not our bug: torch's own stack (aot_eager, no partitioner of ours) gets the embeddings'
    gradient wrong when a compiled block reads the view to_local() returns; the other tests'
    model reads a copy (TinyLlama.copy_embeddings)."""
    variants = [{"budget": 1.0, "compiler": "nop", "sequence_parallel": False,
                 "checkpoint": False}]
    results = run_ranks("dist_cases_tp:fsdp_tp_llama", world_size=2,
                        kwargs={"variants": variants, "data_parallel": 1,
                                "backend": "aot_eager", "copy_embeddings": False},
                        timeout=240)
    _check(results, variants)


@pytest.mark.slow
def test_where_torch_2_13_inductor_misplaces_a_mesh_ours_matches_eager():
    """TP with sequence parallel and SAC on a 1x2 (dp x tp) mesh, compiled after a `nop`
    compile in the same process: torch 2.13's own ``backend="inductor"`` saves a mesh among
    the tensors (AOTAutograd then refuses it; 2.11 and 2.15 pass), ours keeps it in the
    opaque group and matches eager."""
    config = {"sequence_parallel": True, "checkpoint": True}
    variants = [{"budget": 0.0, "compiler": "nop", **config},
                {"budget": 0.5, "compiler": "torch_inductor", **config},
                {"budget": 0.5, "compiler": "inductor", **config}]
    results = run_ranks("dist_cases_tp:fsdp_tp_llama", world_size=2,
                        kwargs={"variants": variants, "data_parallel": 1}, timeout=300)
    torch_key = "budget=0.5, compiler=torch_inductor, sequence_parallel=True, checkpoint=True"
    theirs = [by_variant.pop(torch_key) for by_variant in results]
    _check(results, [v for v in variants if v["compiler"] != "torch_inductor"])
    if TORCH_VERSION == (2, 13):
        assert all(isinstance(t, str) and "expected all tensors_saved_with_vc_check to be "
                   "Tensors" in t for t in theirs), theirs
    else:
        assert all(isinstance(t, dict) and t["grad"] <= GRAD_TOLERANCE for t in theirs), theirs
