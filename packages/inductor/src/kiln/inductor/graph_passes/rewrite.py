"""What kiln.inductor's graph rewrites before lowering share (gemv_as_reduction.py, pad_matmuls.py, stems.py): a node's
example value, and replacing the nodes a rule matches by what it builds in their place."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx


def node_val(n: object) -> torch.Tensor | None:
    """The tensor a node's ``meta['val']`` holds, if any."""
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def replace_nodes(gm: fx.GraphModule, build: Callable[[fx.Graph, fx.Node], fx.Node | None]) -> int:
    """For each node, ``build(graph, node)`` (called with insertion before the node) returns the node
    that takes its place, or None to keep it; returns how many were replaced. New nodes have no
    ``meta['val']``: the caller re-propagates metadata."""
    g = gm.graph
    count = 0
    for node in list(g.nodes):
        if node.op != "call_function":
            continue
        with g.inserting_before(node):
            out = build(g, node)
        if out is None:
            continue
        node.replace_all_uses_with(out)
        g.erase_node(node)
        count += 1
    if count:
        g.lint()
        gm.recompile()
    return count
