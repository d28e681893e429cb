"""RNG functionalization: a recomputed random op must reproduce the forward's values.

For every random op a checkpoint policy recomputes, the forward runs it through
``run_and_save_rng_state`` and returns the RNG state it started from; the backward replays it
with ``run_with_rng_state`` on that state. Dropout masks then match between the passes.
"""

from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from .._compat import saved_output_desc_type, saved_output_descs
from ..classify import is_random
from .recompute_tags import must_recompute


def _device_of(node: fx.Node) -> torch.device:
    values = node.meta.get("val")
    for value in values if isinstance(values, (tuple, list)) else (values,):
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return value.device
    return torch.device("cpu")


def _sample_rng_state(device: torch.device) -> torch.Tensor:
    """An example RNG-state tensor for ``meta["val"]`` (fake when tracing is fake)."""
    from torch._guards import detect_fake_mode

    state = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
    fake_mode = detect_fake_mode()
    return fake_mode.from_tensor(state) if fake_mode is not None else state


def functionalize_rng_ops(joint_module: fx.GraphModule, fw_module: fx.GraphModule,
                          bw_module: fx.GraphModule, num_sym_nodes: int
                          ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Thread RNG states from forward to backward for recomputed random ops.

    The states become extra saved tensors: forward outputs just before the saved symbolic
    scalars, backward inputs just before the tangents.
    """
    fw_random = {n.name: n for n in fw_module.graph.nodes if is_random(n)}
    bw_random = {n.name: n for n in bw_module.graph.nodes if is_random(n)}
    pairs = [(fw_random[n.name], bw_random[n.name]) for n in joint_module.graph.nodes
             if must_recompute(n) and is_random(n)
             and n.name in fw_random and n.name in bw_random]
    if not pairs:
        return fw_module, bw_module
    first_tangent = next((p for p in bw_module.graph.find_nodes(op="placeholder")
                          if "tangent" in p.name), None)
    if first_tangent is None:
        raise RuntimeError(
            "RNG functionalization found no tangent placeholder in the backward graph; the "
            "backward must take tangents to place RNG states before them"
        )
    fw_graph, bw_graph = fw_module.graph, bw_module.graph
    states: list[fx.Node] = []
    for index, (fw_node, bw_node) in enumerate(pairs):
        device = _device_of(fw_node)
        with fw_graph.inserting_before(fw_node):
            both = fw_graph.call_function(run_and_save_rng_state,
                                          (fw_node.target, *fw_node.args), fw_node.kwargs)
            state = fw_graph.call_function(operator.getitem, (both, 0))
            state.meta["val"] = _sample_rng_state(device)
            result = fw_graph.call_function(operator.getitem, (both, 1))
            result.meta = copy.copy(fw_node.meta)
        fw_node.replace_all_uses_with(result)
        fw_graph.erase_node(fw_node)
        states.append(state)
        with bw_graph.inserting_before(first_tangent):
            saved_state = bw_graph.placeholder(f"rng_state_output_{index}")
            saved_state.meta["val"] = _sample_rng_state(device)
        with bw_graph.inserting_before(bw_node):
            replay = bw_graph.call_function(run_with_rng_state,
                                            (saved_state, bw_node.target, *bw_node.args),
                                            bw_node.kwargs)
            replay.meta = copy.copy(bw_node.meta)
        bw_node.replace_all_uses_with(replay)
        bw_graph.erase_node(bw_node)

    output = next(iter(fw_graph.find_nodes(op="output")))
    outs = tuple(output.args[0])
    split = len(outs) - num_sym_nodes
    output.args = (outs[:split] + tuple(states) + outs[split:],)
    descs = output.meta.get("desc")
    saved_type = saved_output_desc_type()
    if descs is not None and saved_type is not None:
        user_descs = [d for d in descs if not isinstance(d, saved_type)]
        output.meta["desc"] = user_descs + (
            saved_output_descs(len(output.args[0]) - len(user_descs)) or [])
    fw_module.recompile()
    bw_module.recompile()
    return fw_module, bw_module
