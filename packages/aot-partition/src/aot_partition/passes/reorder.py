"""Reorder the backward like the autograd engine runs it.

Extraction leaves recomputed forward ops where they sat in the joint graph, i.e. all before
the backward proper, so their results would stay alive for the whole backward. This pass walks
the backward from its first tangent user and inserts each op right after pulling in only the
recomputed ops it needs, which keeps recomputed values short-lived.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..classify import is_tangent


def reorder_backward(bw_module: fx.GraphModule) -> fx.GraphModule:
    nodes = list(bw_module.graph.nodes)
    order = {node: i for i, node in enumerate(nodes)}
    first_bw = min((user for t in nodes if is_tangent(t) for user in t.users),
                   key=order.__getitem__, default=None)
    if first_bw is None:  # gradients independent of the tangents: nothing to reorder
        return bw_module
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in bw_module.graph.find_nodes(op="placeholder"):
        env[node] = graph.node_copy(node, env.__getitem__)

    def insert_with_dependencies(node: fx.Node) -> None:
        needed: set[fx.Node] = set()
        stack = [node]
        while stack:
            cur = stack.pop()
            if cur in needed or cur in env:
                continue
            needed.add(cur)
            stack.extend(cur.all_input_nodes)
        for dep in sorted(needed, key=order.__getitem__):
            env[dep] = graph.node_copy(dep, env.__getitem__)

    start = order[first_bw]
    # In-place copies (input mutations) may not read the tangents; keep them.
    for node in nodes[:start]:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            insert_with_dependencies(node)
    for node in nodes[start:]:
        insert_with_dependencies(node)
    return fx.GraphModule(bw_module, graph)
