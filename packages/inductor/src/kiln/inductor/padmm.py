"""Matmuls with a misaligned dimension get zero-padded operands (CUDA only).

cuBLAS picks its fast tensor-core kernels only when the operands' leading dimensions are multiples of
16 bytes. GPT-2's LM head (50257 words) is not: ``x @ W.T`` for 4096 tokens took 3.35 ms on an H200,
the same product with ``W`` padded to 50264 rows 0.46 ms; BERT's 30522-word head 0.82 -> 0.29 ms
(``benchmarks/mm_layout_probe.py``). So a large ``mm``/``addmm`` whose M, N or K is not a multiple of
8 (16-bit) or 4 (fp32) elements computes on zero-padded operands: padding K adds zero products,
padded M rows / N columns are sliced off the result. Each pad is one copy of that operand. The result
is a slice of the padded product (rows of the padded stride) where kernels of the graph read it.

Where it leaves the graph or a view op reads it, callers need eager's contiguous layout. Slicing and
copying the whole padded product held both at once (GPT-2's LM head: 2 x 393 MB for 8 x 512 tokens,
over eager's peak): ``kiln_inductor::mm_padded`` instead computes the padded product a block of rows
at a time and copies each block into the contiguous result, so only 1/``CHUNKS`` of it is extra.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

aten = torch.ops.aten

_ALIGN_BYTES = 16
CHUNKS = 16  # mm_padded's workspace is 1/CHUNKS of its result (row blocks stay large for cuBLAS)
_MIN_MACS = 1 << 30  # smaller products lose less to misalignment than the pad copies cost
_MIN_DIM = 512  # a short misaligned dimension is cheap for cuBLAS
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
          aten.permute.default, aten.t.default, aten.transpose.int, aten.as_strided.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default}


def mm_padded_chunks(bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, m: int, n: int,
                     chunks: int = CHUNKS) -> torch.Tensor:
    """The first ``m`` rows and ``n`` columns of ``addmm(bias, a, b)`` (``mm`` without bias) as a
    contiguous tensor, computed ``chunks`` row blocks at a time. The generated wrapper has a copy
    (``_mm_padded`` in codegen/wrapper.py: portable programs need only torch)."""
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    rows = -(-max(1, -(-m // chunks)) // 8) * 8
    for r in range(0, m, rows):
        e = min(r + rows, m)
        if bias is None:
            prod = torch.mm(a[r:e], b)
        else:
            prod = torch.addmm(bias[r:e] if bias.dim() == 2 and bias.shape[0] != 1 else bias, a[r:e], b)
        out[r:e].copy_(prod[:, :n])
        del prod
    return out


@torch.library.custom_op("kiln_inductor::mm_padded", mutates_args=())
def mm_padded(bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, m: int, n: int) -> torch.Tensor:
    return mm_padded_chunks(bias, a, b, m, n)


@mm_padded.register_fake
def _mm_padded_fake(bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, m: int, n: int) -> torch.Tensor:
    return a.new_empty((m, n))


MM_PADDED = torch.ops.kiln_inductor.mm_padded.default


def _val(n: object) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _padding(node: fx.Node, devices: tuple[str, ...], min_macs: int, min_dim: int) -> tuple[int, int, int] | None:
    """(M, N, K) padded sizes for a matmul worth padding, else None."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default) or node.kwargs:
        return None
    if node.target is aten.addmm.default and len(node.args) > 3:
        return None  # beta/alpha given
    a, b = node.args[-2], node.args[-1]
    va, vb, out = _val(a), _val(b), _val(node)
    if va is None or vb is None or out is None or out.device.type not in devices:
        return None
    if out.dtype not in (torch.float16, torch.bfloat16, torch.float32) or va.dtype != out.dtype:
        return None
    if not all(isinstance(s, int) for s in (*va.shape, *vb.shape)):
        return None  # symbolic sizes
    (m, k), n = va.shape, vb.shape[1]
    if m * n * k < min_macs:
        return None
    align = _ALIGN_BYTES // out.element_size()
    padded = tuple(d if d % align == 0 or d < min_dim else d + align - d % align for d in (m, n, k))
    return padded if padded != (m, n, k) else None  # type: ignore[return-value]


def _pad(g: fx.Graph, x: Any, rows: int, cols: int) -> Any:
    """``x`` (2-D) zero-padded by ``rows``/``cols``; a transposed operand is padded in its own memory
    order, so the padded copy keeps the layout cuBLAS was given."""
    if not rows and not cols:
        return x
    v = _val(x)
    if v is not None and v.stride(0) == 1 and v.shape[0] > 1:
        xt = g.call_function(aten.permute.default, (x, [1, 0]))
        padded = g.call_function(aten.constant_pad_nd.default, (xt, [0, rows, 0, cols]))
        return g.call_function(aten.permute.default, (padded, [1, 0]))
    return g.call_function(aten.constant_pad_nd.default, (x, [0, cols, 0, rows]))


def _pad_bias(g: fx.Graph, bias: Any, m: int, n: int, mp: int, np_: int) -> Any:
    v = _val(bias)
    if v is None or v.dim() == 0:
        return bias
    cols = np_ - n if v.shape[-1] == n and n > 1 else 0
    rows = mp - m if v.dim() == 2 and v.shape[0] == m and m > 1 else 0
    if v.dim() == 1:
        return g.call_function(aten.constant_pad_nd.default, (bias, [0, cols])) if cols else bias
    return g.call_function(aten.constant_pad_nd.default, (bias, [0, cols, 0, rows])) if cols or rows else bias


def pad_misaligned_matmuls(gm: fx.GraphModule, *, devices: tuple[str, ...] = ("cuda",),
                           min_macs: int = _MIN_MACS, min_dim: int = _MIN_DIM) -> int:
    """Rewrite each large misaligned mm/addmm on ``devices``; returns how many. New nodes have no
    ``meta['val']``: the caller re-propagates metadata."""
    g = gm.graph
    count = 0
    for node in list(g.nodes):
        sizes = _padding(node, devices, min_macs, min_dim)
        if sizes is None:
            continue
        mp, np_, kp = sizes
        a, b = node.args[-2], node.args[-1]
        (m, k), n = _val(a).shape, _val(b).shape[1]  # type: ignore[union-attr]
        with g.inserting_before(node):
            ap = _pad(g, a, mp - m, kp - k)
            bp = _pad(g, b, kp - k, np_ - n)
            bias = _pad_bias(g, node.args[0], m, n, mp, np_) if node.target is aten.addmm.default else None
            if any(u.op == "output" or u.target in _VIEWS for u in node.users):
                # eager's contiguous layout, without a second whole copy (the module doc says why)
                out = g.call_function(MM_PADDED, (bias, ap, bp, m, n))
            else:
                out = (g.call_function(aten.addmm.default, (bias, ap, bp)) if bias is not None
                       else g.call_function(aten.mm.default, (ap, bp)))
                if np_ != n:
                    out = g.call_function(aten.slice.Tensor, (out, 1, 0, n))
                if mp != m:
                    out = g.call_function(aten.slice.Tensor, (out, 0, 0, m))
        node.replace_all_uses_with(out)
        g.erase_node(node)
        count += 1
    if count:
        g.lint()
        gm.recompile()
    return count
