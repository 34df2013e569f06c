"""Matmuls with a misaligned dimension get zero-padded operands (CUDA only).

cuBLAS picks its fast tensor-core kernels only when the operands' leading dimensions are multiples of
16 bytes. GPT-2's LM head (50257 words) and BERT's (30522) are not, and their products run several
times faster on padded operands (``benchmarks/mm_layout_probe.py`` measures it). So a large
``mm``/``addmm`` whose M, N or K is not a multiple of 8 (16-bit) or 4 (fp32) elements computes on
zero-padded operands: padding K adds zero products, padded M rows / N columns are sliced off the
result. Each pad is one copy of that operand. The result is a slice of the padded product (rows of
the padded stride) where kernels of the graph read it.

Where it leaves the graph or a view op reads it, callers need eager's contiguous layout. Slicing and
copying the whole padded product held both at once, plus the padded weight (GPT-2's LM head:
2 x 393 + 74 MB for 8 x 512 tokens, over eager's peak). There ``kiln_inductor::mm_padded`` computes
``BLOCK`` aligned columns at a time into a workspace inside the result's own not-yet-written last
rows and copies each block into place; those last rows (~4% for GPT-2) take the unaligned call.
(Row chunks written through a padded leading dimension would take fewer launches, but cuBLAS is slow
on such outputs.) Extra memory: none (the result, as eager); the weight is never padded.

Note: a product whose result rows (N) are misaligned is better computed by kiln's Triton matmul template
(autotune/matmul_template_kernel.py), which reads the operands as they are and stores straight into
the unaligned contiguous result with masked stores (on GPT-2's head, bf16 4096 x 768 @ 768 x 50257,
about twice as fast as mm_padded, which beats cuBLAS's unaligned call: benchmarks/RESULTS.md). With
``template=True`` this pass leaves such products alone (``templated``) and matmul_templates.py
``template_misaligned_matmuls`` turns them into the template after scheduling, its fused epilogue included. ``mm_padded`` stays for what the
template does not take: fp32 without TF32 (the template's IEEE ``tl.dot`` runs on FMA units, where
cuBLAS's SGEMM is expected to stay ahead), an addmm whose bias the template cannot read (a 0-d one),
and graphs compiled with the template off.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import fx

from ..options import MisalignedMatmuls
from .rewrite import node_val, replace_nodes

aten = torch.ops.aten

_ALIGN_BYTES = 16
BLOCK = 2048  # mm_padded's columns per aligned product (fewer, larger cuBLAS calls vs a smaller unaligned tail)
_RULES = MisalignedMatmuls()  # the default thresholds (options.py)
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
          aten.permute.default, aten.t.default, aten.transpose.int, aten.as_strided.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default}


# The wrapper module defines this function too (codegen/wrapper.py adds the source): a saved program
# runs with torch alone, without this package registering the op.
MM_PADDED_SOURCE = '''
def _mm_padded(bias, a, b, m, block, out=None):
    """kiln_inductor::mm_padded (kiln.inductor graph_passes/pad_matmuls.py): ``addmm(bias, a, b)[:m]`` in a new contiguous
    tensor, with no memory beyond it. cuBLAS is fast only on aligned widths, which the result's odd
    row length is not. So the first ``m - tail`` rows are computed ``block`` (aligned) columns at a
    time into a workspace carved out of the result's own last ``tail`` rows (not written yet), each
    block copied into place; the last block is shifted left to stay aligned (it recomputes a few
    columns), so no weight rows are padded. The ``tail`` rows (a few percent) then go straight into
    the result through the unaligned call. ``out``: the result's memory, given (contiguous)."""
    k, n = b.shape
    align = max(1, 16 // a.element_size())
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    flat = out.view(-1)

    def rows(x, r0, r1):  # a bias's rows for result rows r0:r1 (a broadcast bias as it is)
        return x[r0:r1] if x is not None and x.dim() == 2 and x.shape[0] != 1 else x

    def cols(x, c0, c1):
        return x[..., c0:c1] if x is not None and x.dim() and x.shape[-1] == n else x

    bw = min(block, n - n % align)
    head = 0
    if bw > 0:
        tail = -(-m * bw // (n + bw))  # the workspace (head x bw) fits in the tail rows (tail x n)
        head = (m - tail) // align * align  # an aligned workspace start
    if head > 0:
        ws = flat[head * n: head * n + head * bw].view(head, bw)
        c = 0
        while c < n:
            c0 = min(c, n - bw)  # the last block ends at n: shifted left, still bw wide
            bb, bias_blk = b[:, c0:c0 + bw], cols(rows(bias, 0, head), c0, c0 + bw)
            if bias_blk is None:
                torch.mm(a[:head], bb, out=ws)
            else:
                torch.addmm(bias_blk, a[:head], bb, out=ws)
            out[:head, c:c0 + bw].copy_(ws[:, c - c0:])
            c = c0 + bw
    if head < m:
        if bias is None:
            torch.mm(a[head:m], b, out=out[head:])
        else:
            torch.addmm(rows(bias, head, m), a[head:m], b, out=out[head:])
    return out
'''
_ns: dict[str, Any] = {"torch": torch}
exec(MM_PADDED_SOURCE, _ns)  # noqa: S102 - our own source, shared with the generated wrapper
mm_padded_blocks = _ns["_mm_padded"]


# an explicit schema: inferring it from (string) annotations differs between torch versions
@torch.library.custom_op("kiln_inductor::mm_padded", mutates_args=(),
                         schema="(Tensor? bias, Tensor a, Tensor b, SymInt m, int block) -> Tensor")
def mm_padded(bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, m: int, block: int) -> torch.Tensor:
    return mm_padded_blocks(bias, a, b, m, block)  # type: ignore[no-any-return]


@mm_padded.register_fake
def _mm_padded_fake(bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, m: int, block: int) -> torch.Tensor:
    return a.new_empty((m, b.shape[1]))


MM_PADDED = torch.ops.kiln_inductor.mm_padded.default


def _padding(node: fx.Node, devices: tuple[str, ...], min_macs: int, min_dim: int,
             template: bool) -> tuple[Any, Any, Any] | None:
    """(M, N, K) padded sizes for a matmul worth padding, else None (also for one the template takes).
    A symbolic size is returned as it is (``_symbolic_padding``)."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default) or node.kwargs:
        return None
    if node.target is aten.addmm.default and len(node.args) > 3:
        return None  # beta/alpha given
    a, b = node.args[-2], node.args[-1]
    va, vb, out = node_val(a), node_val(b), node_val(node)
    if va is None or vb is None or out is None or out.device.type not in devices:
        return None
    if out.dtype not in (torch.float16, torch.bfloat16, torch.float32) or va.dtype != out.dtype:
        return None
    (m, k), n = va.shape, vb.shape[1]
    if not all(isinstance(d, int) for d in (m, n, k)):
        if template and _templated_rows(node, va, vb, out.dtype, min_macs, min_dim):
            return None  # matmul_templates.py's template_misaligned_matmuls computes it, M read per call
        return _symbolic_padding(va, vb, (m, n, k), out.dtype, min_macs, min_dim)
    if m * n * k < min_macs:
        return None
    if template and templated(m, n, k, out.dtype, min_macs, min_dim) and (
            node.target is aten.mm.default or _template_bias(node_val(node.args[0]), m, n, out.dtype)):
        return None  # matmul_templates.py's template_misaligned_matmuls computes it
    align = _ALIGN_BYTES // out.element_size()
    padded = tuple(d if d % align == 0 or d < min_dim else d + align - d % align for d in (m, n, k))
    return padded if padded != (m, n, k) else None  # type: ignore[return-value]


def templated(m: int, n: int, k: int, dtype: torch.dtype, min_macs: int, min_dim: int) -> bool:
    """Whether a static M x K @ K x N matmul runs as kiln's Triton template (module Note): a large one
    whose result rows are misaligned and long, in half precision or fp32 with TF32 on (torch's setting,
    which the template follows)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return False
    return m * n * k >= min_macs and n >= min_dim and n * dtype.itemsize % _ALIGN_BYTES != 0


def _templated_rows(node: fx.Node, va: Any, vb: Any, dtype: torch.dtype, min_macs: int, min_dim: int) -> bool:
    """Whether the template takes a matmul whose only symbolic size is its row count M (a dynamic
    language model's tokens times the LM head): ``templated`` at the example's M, static strides, and a
    bias (addmm) of one row. The template then reads M per call, as it reads static sizes as literals."""
    (m, k), n = va.shape, vb.shape[1]
    hint = _hint(m)
    if isinstance(m, int) or hint is None or not isinstance(k, int) or not isinstance(n, int):
        return False
    if not all(isinstance(x, int) for x in (*va.stride(), *vb.stride())):
        return False
    if not templated(hint, n, k, dtype, min_macs, min_dim):
        return False
    if node.target is aten.addmm.default:
        v = node_val(node.args[0])
        return v is not None and v.dtype == dtype and tuple(v.shape) in ((n,), (1, n))
    return True


def _template_bias(v: Any, m: int, n: int, dtype: torch.dtype) -> bool:
    """An addmm bias the template reads (matmul_templates.py ``_bias``): [n], [1|m, 1|n], of the product's dtype."""
    if v is None or v.dtype != dtype or v.dim() not in (1, 2):
        return False
    rows, cols = (1, *v.shape) if v.dim() == 1 else tuple(v.shape)
    return rows in (1, m) and cols in (1, n)


def _transposed_source(x: Any) -> Any:
    """The 2-D node ``x`` transposes (``t``, ``permute [1, 0]``, ``transpose 0 1``), else None."""
    if not isinstance(x, fx.Node) or x.op != "call_function" or not x.args:
        return None
    args: tuple[Any, ...] = x.args
    src = args[0]
    v = node_val(src)
    if v is None or v.dim() != 2:
        return None
    if x.target is aten.t.default or (x.target is aten.permute.default and list(args[1]) == [1, 0]) or (
            x.target is aten.transpose.int and sorted(int(d) % 2 for d in args[1:3]) == [0, 1]):
        return src
    return None


def _symbolic_padding(va: Any, vb: Any, mnk: tuple[Any, Any, Any], dtype: torch.dtype, min_macs: int,
                      min_dim: int) -> tuple[Any, Any, Any] | None:
    """(M, N, K) for a matmul with a symbolic size: its static misaligned sizes padded, the symbolic
    ones as they are; None when that leaves a leading dimension (an operand's or the result's row
    length in memory) symbolic, as its alignment then changes from call to call, or pads nothing.

    Why: a token count (batch x length) is symbolic in every dynamic language model. Its LM head
    (GPT-2: 50257 words) ran as cuBLAS's unaligned call, 3.35 ms against mm_padded's 1.21 for bf16
    4096 x 768 @ 768 x 50257 on an H200 (benchmarks/RESULTS.md), and the head's backward products
    (``g @ W``: K = 50257; ``g.t() @ h``: M = 50257 over a symbolic K) took 4.6 ms per step of
    unaligned calls against the static graph's 0.6 ms of padded ones. A symbolic M with misaligned
    result rows runs as the Triton template where it takes the product (``_templated_rows``), else as
    ``mm_padded``, correct for every M (below about ``N / BLOCK`` rows, a decode step, its workspace has
    no room and it makes exactly the unaligned call). The size hints (the example's sizes) decide
    whether the rewrite is worth it; no size is compared, so no guard is added."""
    hints = tuple(_hint(d) for d in mnk)
    if any(h is None for h in hints) or hints[0] * hints[1] * hints[2] < min_macs:  # type: ignore[operator]
        return None
    align = _ALIGN_BYTES // dtype.itemsize
    m, n, k = padded = cast(tuple[Any, Any, Any], tuple(
        d if not isinstance(d, int) or d % align == 0 or d < min_dim else d + align - d % align for d in mnk))
    # the leading dimension of a row-major operand is its column count, of a transposed one its row count
    rows_a, rows_b = _row_major(va), _row_major(vb)
    if rows_a is None or rows_b is None:
        return None
    if not all(isinstance(d, int) for d in (k if rows_a else m, n if rows_b else k, n)):
        return None
    return padded if any(p is not d for p, d in zip(padded, mnk)) else None


def _hint(d: Any) -> int | None:
    """A size's value in the example the graph was traced with."""
    if isinstance(d, int):
        return d
    hint = getattr(d.node, "hint", None)
    return hint if isinstance(hint, int) else None


def _row_major(v: Any) -> bool | None:
    """Whether a 2-D operand is row-major (True) or transposed (False) in memory; None when its strides
    do not say so statically."""
    s0, s1 = v.stride()
    if isinstance(s1, int) and s1 == 1:
        return True
    if isinstance(s0, int) and s0 == 1:
        return False
    return None


def _pad(g: fx.Graph, x: Any, rows: int, cols: int, made: dict[tuple, fx.Node]) -> Any:
    """``x`` (2-D) zero-padded by ``rows``/``cols``; a transposed operand is padded in its own memory
    order, so the padded copy keeps the layout cuBLAS was given. ``made`` shares pads of one tensor:
    a backward pads GPT-2's logits gradient ``g`` for ``g @ W`` (K) and ``g.t() @ h`` (M), the same
    padded rows of ``g`` both times (411 MB copied twice per step before)."""
    if not rows and not cols:
        return x
    v = node_val(x)
    if v is not None and _row_major(v) is False:
        src = _transposed_source(x)
        key = ("t", _same_value(src if src is not None else x), rows, cols)
        if key not in made:
            xt = src if src is not None else g.call_function(aten.permute.default, (x, [1, 0]))
            made[key] = _padded(g, xt, cols, rows, made)
        return g.call_function(aten.permute.default, (made[key], [1, 0]))
    return _padded(g, x, rows, cols, made)


def _same_value(x: Any) -> Any:
    """A key equal for two view nodes of one tensor with the same arguments (a backward views its
    3-D logits gradient as [B*L, V] once per matmul)."""
    if isinstance(x, fx.Node) and x.op == "call_function" and x.target in (aten.view.default, aten._unsafe_view.default,
                                                                            aten.reshape.default) and not x.kwargs:
        args: tuple[Any, ...] = x.args
        return (x.target, _same_value(args[0]), tuple(args[1]))
    return x


def _padded(g: fx.Graph, x: Any, rows: int, cols: int, made: dict[tuple, fx.Node]) -> fx.Node:
    key = ("pad", _same_value(x), rows, cols)
    if key not in made:
        made[key] = g.call_function(aten.constant_pad_nd.default, (x, [0, cols, 0, rows]))
    return made[key]


def _pad_bias(g: fx.Graph, bias: Any, rows: int, cols: int) -> Any:
    """An addmm bias padded by ``rows``/``cols`` along the dims it does not broadcast (a padded size
    is static, so a dim it pads is too)."""
    v = node_val(bias)
    if v is None or v.dim() == 0:
        return bias
    cols = cols if isinstance(v.shape[-1], int) and v.shape[-1] > 1 else 0
    rows = rows if v.dim() == 2 and isinstance(v.shape[0], int) and v.shape[0] > 1 else 0
    if v.dim() == 1:
        return g.call_function(aten.constant_pad_nd.default, (bias, [0, cols])) if cols else bias
    return g.call_function(aten.constant_pad_nd.default, (bias, [0, cols, 0, rows])) if cols or rows else bias


def _rewrite(g: fx.Graph, node: fx.Node, sizes: tuple[Any, Any, Any], block: int,
             made: dict[tuple, fx.Node]) -> fx.Node:
    """The nodes computing ``node`` on padded operands (inserted before it); returns the result."""
    a, b = node.args[-2], node.args[-1]
    (m, k), n = node_val(a).shape, node_val(b).shape[1]  # type: ignore[union-attr]
    # how much each size grows: a symbolic size is never padded
    dm, dn, dk = (p - d if isinstance(d, int) else 0 for p, d in zip(sizes, (m, n, k)))
    addmm = node.target is aten.addmm.default
    ap = _pad(g, a, dm, dk, made)
    if dn and (not isinstance(m, int) or any(u.op == "output" or u.target in _VIEWS for u in node.users)):
        # eager's contiguous layout without whole padded copies (the module doc says why): the rows
        # are aligned chunk by chunk inside mm_padded, so only M and K are padded here; a symbolic
        # row count is read from the operand per call
        rows = m if isinstance(m, int) else g.call_function(aten.sym_size.int, (a, 0))
        bias = _pad_bias(g, node.args[0], dm, 0) if addmm else None
        return g.call_function(MM_PADDED, (bias, ap, _pad(g, b, dk, 0, made), rows, block))
    bp = _pad(g, b, dk, dn, made)
    if addmm:
        out = g.call_function(aten.addmm.default, (_pad_bias(g, node.args[0], dm, dn), ap, bp))
    else:
        out = g.call_function(aten.mm.default, (ap, bp))
    if dn:
        out = g.call_function(aten.slice.Tensor, (out, 1, 0, n))
    if dm:
        out = g.call_function(aten.slice.Tensor, (out, 0, 0, m))
    return out


def pad_misaligned_matmuls(gm: fx.GraphModule, *, devices: tuple[str, ...] = _RULES.devices,
                           min_macs: int = _RULES.min_macs, min_dim: int = _RULES.min_dim, block: int = BLOCK,
                           template: bool = False) -> int:
    """Rewrite each large misaligned mm/addmm on ``devices``; returns how many. ``template``: leave
    those the Triton template takes (``templated``) as they are. New nodes have no ``meta['val']``:
    the caller re-propagates metadata."""
    made: dict[tuple, fx.Node] = {}  # pads shared between matmuls (``_pad``)

    def build(g: fx.Graph, node: fx.Node) -> fx.Node | None:
        sizes = _padding(node, devices, min_macs, min_dim, template)
        return None if sizes is None else _rewrite(g, node, sizes, block, made)
    return replace_nodes(gm, build)
