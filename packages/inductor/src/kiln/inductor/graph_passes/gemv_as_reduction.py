"""Matrix-vector products as generated reductions (Triton backend only).

A matmul with one row (bs=1 decoding: ``x[1, K] @ W.T``) is bound by reading the weight, and cuBLAS
runs it as its own kernel with a fixed launch and tail cost, between the kernels that produce ``x``
and consume the result. Written as ``sum(x[:, :, None] * W.T[None], dim=1)`` in fp32 it becomes one
bandwidth-bound reduction the scheduler can fuse with its neighbours (the RMSNorm before it, the
activation after it), and a decode step launches fewer kernels. Only for the Triton backend: the
C++ path keeps calling the BLAS extern.
"""

from __future__ import annotations

import torch
from torch import fx

from .rewrite import node_val, replace_nodes

aten = torch.ops.aten

_MM = {aten.mm.default, aten.addmm.default}


def _is_gemv(node: fx.Node, max_k: int) -> bool:
    if node.target not in _MM:
        return False
    a, b = (node.args[0], node.args[1]) if node.target is aten.mm.default else (node.args[1], node.args[2])
    va, vb = node_val(a), node_val(b)
    if va is None or vb is None or node.kwargs:
        return False
    if not all(isinstance(s, int) for s in (*va.shape, *vb.shape)):
        return False  # symbolic sizes: keep the extern
    if node.target is aten.addmm.default and len(node.args) > 3:
        return False  # beta/alpha given
    return va.shape[0] == 1 and va.dtype in (torch.float16, torch.bfloat16, torch.float32) and \
        va.shape[1] <= max_k


def rewrite_gemv(gm: fx.GraphModule, *, max_k: int = 16384) -> int:
    """Replace one-row ``mm``/``addmm`` by a fp32 multiply + sum reduction; returns how many.
    New nodes have no ``meta['val']``: the caller re-propagates metadata."""
    def build(g: fx.Graph, node: fx.Node) -> fx.Node | None:
        if not _is_gemv(node, max_k):
            return None
        out_dtype = node_val(node).dtype  # type: ignore[union-attr]
        bias = node.args[0] if node.target is aten.addmm.default else None
        a, b = (node.args[0], node.args[1]) if bias is None else (node.args[1], node.args[2])
        a32 = g.call_function(aten._to_copy.default, (a,), {"dtype": torch.float32})
        b32 = g.call_function(aten._to_copy.default, (b,), {"dtype": torch.float32})
        prod = g.call_function(aten.mul.Tensor, (g.call_function(aten.unsqueeze.default, (a32, 2)),
                                                 g.call_function(aten.unsqueeze.default, (b32, 0))))
        acc = g.call_function(aten.sum.dim_IntList, (prod, [1]))
        if bias is not None:
            acc = g.call_function(aten.add.Tensor, (acc, bias))
        return g.call_function(aten._to_copy.default, (acc,), {"dtype": out_dtype})
    return replace_nodes(gm, build)
