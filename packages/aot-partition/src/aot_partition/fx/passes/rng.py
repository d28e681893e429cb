"""RNG replay: a recomputed random op must reproduce the forward's values.

Every random op that runs in both the forward and the backward graph (recomputed for any
reason: the memory-budget knapsack, aggressive options, a checkpoint policy) runs in the
forward through ``run_and_save_rng_state``, which returns the RNG state it started from; the
backward replays it with ``run_with_rng_state`` on that state (our operators, rng_ops.py:
torch's of the same names fail under a user's dispatch mode). Dropout masks then match
between the passes, and the backward leaves the global RNG where it was. The saved state is
small next to a mask on real sizes: 16 bytes on CUDA, 5,056 bytes (Mersenne Twister) on CPU.

A random op that cannot be replayed (its own ``generator=``, or a device other than CPU and
CUDA) is never recomputed: ``replay_obstacle`` says why, and the policy bans it for good.
"""

from __future__ import annotations

import copy
import functools
import operator
from typing import Any

import torch
import torch.fx as fx

from .._compat import saved_output_desc_type, saved_output_descs
from ..joint import is_backward_state, is_bwd_seed_offset, is_random, is_tangent, random_calls
from ..sizes import is_opaque
from .rng_ops import register_inductor_fallbacks, run_and_save_rng_state, run_with_rng_state

REPLAYABLE_DEVICES = ("cpu", "cuda")
RNG_STATE_PREFIX = "rng_state_output_"  # names of the backward's RNG-state inputs


def _devices_of(node: fx.Node) -> set[torch.device]:
    values = node.meta.get("val")
    return {v.device for v in (values if isinstance(values, (tuple, list)) else (values,))
            if isinstance(v, torch.Tensor)}


def device_of(node: fx.Node) -> torch.device:
    cuda = [d for d in _devices_of(node) if d.type == "cuda"]
    return cuda[0] if cuda else torch.device("cpu")


def replay_obstacle(node: fx.Node) -> str | None:
    """Why recomputing random ``node`` could not replay the forward's draw, or None."""
    if not is_random(node):
        return None
    if node.kwargs.get("generator") is not None:
        return ("random op with its own generator: only the default generator's state can "
                "be replayed")
    other = sorted(str(d) for d in _devices_of(node) if d.type not in REPLAYABLE_DEVICES)
    if other:
        return f"random op on {', '.join(other)}: its RNG state cannot be replayed"
    return None


@functools.cache
def rng_state_nbytes(device_type: str) -> int:
    """Bytes of one saved RNG state for ``device_type`` (what replaying a random op costs)."""
    if device_type == "cuda":
        return 16  # seed and offset of the Philox generator
    return torch.get_rng_state().numel()


def _sample_rng_state(device: torch.device) -> torch.Tensor:
    """An example RNG-state tensor for ``meta["val"]`` (fake when tracing is fake)."""
    from torch._guards import detect_fake_mode

    state = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
    fake_mode = detect_fake_mode()
    return fake_mode.from_tensor(state) if fake_mode is not None else state


def recomputed_random_ops(fw_graph: fx.Graph, bw_graph: fx.Graph
                          ) -> list[tuple[fx.Node, fx.Node]]:
    """(forward node, backward node) of each random op both graphs run, in forward order."""
    bw_random = {n.name: n for n in random_calls(bw_graph.nodes)}
    if not bw_random:
        return []
    return [(n, bw_random[n.name]) for n in fw_graph.nodes
            if n.name in bw_random and is_random(n)]


def replay_random_ops(fw_graph: fx.Graph, bw_graph: fx.Graph, num_sym_nodes: int
                      ) -> list[str]:
    """Thread RNG states from forward to backward for every recomputed random op.

    The states become extra saved tensors, last of them: forward outputs just before the saved
    opaque objects and symbolic scalars, backward inputs just before the saved opaque objects
    and the tangents (the groups AOTAutograd's runtime expects, see extract.py). Returns the
    names of the replayed ops.
    """
    pairs = recomputed_random_ops(fw_graph, bw_graph)
    if not pairs:
        return []
    register_inductor_fallbacks()
    placeholders = list(bw_graph.find_nodes(op="placeholder"))
    # Saved tensors end where the opaque objects (or tangents, backward seeds, backward
    # state) begin.
    after_saved = next((p for p in placeholders if is_opaque(p) or is_tangent(p)
                        or is_bwd_seed_offset(p) or is_backward_state(p)), None)
    num_opaque = sum(is_opaque(p) for p in placeholders)
    states: list[fx.Node] = []
    for index, (fw_node, bw_node) in enumerate(pairs):
        device = device_of(fw_node)
        fw_op: Any = fw_node.target  # an OpOverload (is_random checks call_function nodes)
        with fw_graph.inserting_before(fw_node):
            both = fw_graph.call_function(run_and_save_rng_state, (fw_op, *fw_node.args),
                                          fw_node.kwargs)
            state = fw_graph.call_function(operator.getitem, (both, 0))
            state.meta["val"] = _sample_rng_state(device)
            result = fw_graph.call_function(operator.getitem, (both, 1))
            result.meta = copy.copy(fw_node.meta)
        fw_node.replace_all_uses_with(result)
        fw_graph.erase_node(fw_node)
        states.append(state)
        where = (bw_graph.inserting_before(after_saved) if after_saved is not None
                 else bw_graph.inserting_after(placeholders[-1]))
        with where:
            saved_state = bw_graph.placeholder(f"{RNG_STATE_PREFIX}{index}")
            saved_state.meta["val"] = _sample_rng_state(device)
        placeholders.append(saved_state)
        with bw_graph.inserting_before(bw_node):
            bw_op: Any = bw_node.target
            replay = bw_graph.call_function(run_with_rng_state,
                                            (saved_state, bw_op, *bw_node.args), bw_node.kwargs)
            replay.meta = copy.copy(bw_node.meta)
        bw_node.replace_all_uses_with(replay)
        bw_graph.erase_node(bw_node)

    output = next(iter(fw_graph.find_nodes(op="output")))
    outs = tuple(output.args[0])
    split = len(outs) - num_sym_nodes - num_opaque
    output.args = (outs[:split] + tuple(states) + outs[split:],)
    descs = output.meta.get("desc")
    saved_type = saved_output_desc_type()
    if descs is not None and saved_type is not None:
        user_descs = [d for d in descs if not isinstance(d, saved_type)]
        output.meta["desc"] = user_descs + (
            saved_output_descs(len(output.args[0]) - len(user_descs)) or [])
    return [fw.name for fw, _ in pairs]
