"""Lowering rules for gathers (embedding, index_select, gather, index.Tensor), cat and constant_pad_nd.

Gathers become indirect loads: the index reads symbols ``d0..`` bound to loaded index values.
cat and pad become ``where`` chains over index ranges; codegen never evaluates an untaken branch's load.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
from torch import fx

from kiln.graph import annotations_of

from ..ir import (
    Constant,
    Expr,
    FloorDiv,
    IndexExpr,
    IndexValue,
    Load,
    cast,
    contiguous_strides,
    index_var,
    index_vars,
    op,
    product,
    reads,
)
from .common import Rule, out_dtype, out_shape, size_value, symbolic_start
from .context import LoweringContext, NotLowered
from .values import Lazy, Strided, TensorValue, broadcast_at, value_at

RULES: dict[str, Rule] = {}


def _wrap(idx: Expr, size: IndexExpr, checked: str = "check_index") -> Expr:
    """Negative indices count from the end. ``checked``: the op checking the index against the dim as
    the eager op does (``_checked``), or "" for none."""
    i = cast(idx, torch.int64)
    if checked:
        return op(checked, i, size_value(size, torch.int64), dtype=torch.int64)
    return op("where", op("lt", i, Constant(0, torch.int64), dtype=torch.bool),
              op("add", i, size_value(size, torch.int64), dtype=torch.int64), i, dtype=torch.int64)


_NON_NEGATIVE = ("embedding", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce")


def _checked(ctx: LoweringContext) -> str:
    """How the op being lowered checks its indices in eager: ``check_index`` (negative ones from the end:
    ``x[idx]``, ``index_put``), ``check_index_nonneg`` (negative ones are errors too), or "" (the
    ``_unsafe_`` ops, for indices a decomposition computed: eager does not check them either)."""
    if "_unsafe_" in ctx.origin:
        return ""
    return "check_index_nonneg" if ctx.origin in _NON_NEGATIVE else "check_index"


def gather_load(ctx: LoweringContext, x: TensorValue, idx: list[IndexExpr | Expr]) -> Expr:
    """``x`` at an index whose entries are sympy (direct) or Exprs (loaded index values)."""
    xs = x if isinstance(x, Strided) else ctx.realize(x)
    flat: IndexExpr = xs.offset
    indirect: list[Expr] = []
    for k, (i, st) in enumerate(zip(idx, xs.stride)):
        if isinstance(i, sympy.Expr):
            flat = flat + i * st
        else:
            flat = flat + index_var("d", len(indirect)) * st
            indirect.append(_wrap(i, xs.shape[k], _checked(ctx)))
    return Load(xs.buffer, sympy.expand(flat), xs.dtype, tuple(indirect))


def _embedding(ctx: LoweringContext, node: fx.Node, weight: TensorValue, indices: TensorValue, *rest) -> Lazy:
    shape = out_shape(node)
    iv = list(index_vars("i", len(shape)))
    row = value_at(indices, iv[:-1])
    return Lazy(shape, weight.dtype, gather_load(ctx, weight, [row, iv[-1]]))


RULES["aten.embedding.default"] = _embedding


def _index_select(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, index: TensorValue) -> Lazy:
    shape = out_shape(node)
    n = len(shape)
    dim = dim + n if dim < 0 else dim
    iv: list = list(index_vars("i", n))
    if n == 0:
        return Lazy(shape, x.dtype, gather_load(ctx, x, []))
    iv[dim] = value_at(index, [iv[dim]] if index.shape else [])
    return Lazy(shape, x.dtype, gather_load(ctx, x, iv))


RULES["aten.index_select.default"] = _index_select


def _gather(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, index: TensorValue,
            sparse_grad: bool = False) -> Lazy:
    shape = out_shape(node)
    n = len(shape)
    if n == 0:  # a 0-d result still reads x at the index's value (the lerp of torch.quantile's two gathers)
        full0: list = [sympy.Integer(0)] * len(x.shape)
        if full0:
            full0[dim % len(x.shape)] = value_at(index, [sympy.Integer(0)] * len(index.shape))
        return Lazy(shape, x.dtype, gather_load(ctx, x, full0))
    dim = dim + n if dim < 0 else dim
    iv: list = list(index_vars("i", n))
    full = list(iv)
    full[dim] = value_at(index, iv)
    return Lazy(shape, x.dtype, gather_load(ctx, x, full))


RULES["aten.gather.default"] = _gather


def _index(ctx: LoweringContext, node: fx.Node, x: TensorValue, indices: Sequence[TensorValue | None]) -> Lazy:
    shape = out_shape(node)
    iv = list(index_vars("i", len(shape)))
    idx_pos = [k for k, t in enumerate(indices) if t is not None]
    if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
        raise NotLowered("boolean mask indexing has a data-dependent shape")
    b_ndim = max(len(indices[k].shape) for k in idx_pos)  # type: ignore[union-attr]
    adjacent = idx_pos == list(range(idx_pos[0], idx_pos[-1] + 1))
    start = idx_pos[0] if adjacent else 0
    bvars = iv[start:start + b_ndim]
    rest = iv[:start] + iv[start + b_ndim:]
    full: list = []
    it = iter(rest)
    for k in range(len(x.shape)):
        t = indices[k] if k < len(indices) else None
        full.append(broadcast_at(t, bvars) if t is not None else next(it))
    return Lazy(shape, x.dtype, gather_load(ctx, x, full))


RULES["aten.index.Tensor"] = _index
RULES["aten._unsafe_index.Tensor"] = _index


# a cat of more parts than this is a where-chain slower than ATen's copy, unless its result is small
CAT_MAX_CHAIN = 16
# ... at most this many elements: then the parts are a balanced tree of selects (log2(parts) compares
# an element) stored once. torch.optim's foreach Adam under a compiler stacks one step size per parameter
# (``torch.stack`` of 0-d tensors) for ``_foreach_addcdiv.Tensor``: through ATen, every part was a buffer
# of its own, allocated per call (200 parameters: 200 allocations and 200 pointers a step)
CAT_SMALL_NUMEL = 4096


def _cat(ctx: LoweringContext, node: fx.Node, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    shape = out_shape(node)
    n = len(shape)
    dim = dim + n if dim < 0 else dim
    parts = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)]
    numel = product(list(shape))
    small = isinstance(numel, (int, sympy.Integer)) and int(numel) <= CAT_SMALL_NUMEL
    if len(parts) > CAT_MAX_CHAIN and not small:
        raise NotLowered(f"cat of {len(parts)} tensors (a where-chain this long is slower than a copy)")
    d = out_dtype(node)
    iv = list(index_vars("i", n))
    starts, pos = [], sympy.Integer(0)
    for t in parts:
        starts.append(pos)
        pos = pos + t.shape[dim]

    def part(k: int) -> Expr:
        idx = list(iv)
        idx[dim] = iv[dim] - starts[k]
        return cast(value_at(parts[k], idx), d)

    def before(k: int) -> Expr:  # the index is in a part before part k
        return op("lt", IndexValue(iv[dim], torch.int64), size_value(starts[k], torch.int64), dtype=torch.bool)

    if len(parts) <= CAT_MAX_CHAIN:
        body = part(len(parts) - 1)
        for k in range(len(parts) - 2, -1, -1):
            body = op("where", before(k + 1), part(k), body, dtype=d)
        return Lazy(shape, d, body)

    def tree(lo: int, hi: int) -> Expr:  # parts lo..hi-1
        if hi - lo == 1:
            return part(lo)
        mid = (lo + hi) // 2
        return op("where", before(mid), tree(lo, mid), tree(mid, hi), dtype=d)
    return ctx.realize(Lazy(shape, d, tree(0, len(parts))))


RULES["aten.cat.default"] = _cat


def _pad(ctx: LoweringContext, node: fx.Node, x: TensorValue, pad: Sequence[int], value: float = 0.0) -> Lazy:
    shape = out_shape(node)
    n = len(shape)
    d = x.dtype
    iv = list(index_vars("i", n))
    idx = list(iv)
    conds: list[Expr] = []
    for j in range(len(pad) // 2):
        k = n - 1 - j
        lo = int(pad[2 * j])
        idx[k] = iv[k] - lo
        if lo > 0:
            conds.append(op("ge", IndexValue(iv[k], torch.int64), Constant(lo, torch.int64), dtype=torch.bool))
        if int(pad[2 * j + 1]) > 0 or lo > 0:
            conds.append(op("lt", IndexValue(iv[k], torch.int64), size_value(x.shape[k] + lo, torch.int64),
                            dtype=torch.bool))
    val = value_at(x, idx)
    if not conds:
        return Lazy(shape, d, val)
    cond = conds[0]
    for c in conds[1:]:
        cond = op("logical_and", cond, c, dtype=torch.bool)
    fill = cast(Constant(value, torch.float64 if isinstance(value, float) else torch.int64), d)
    return Lazy(shape, d, op("where", cond, val, fill, dtype=d))


RULES["aten.constant_pad_nd.default"] = _pad


def _slice_scatter(ctx: LoweringContext, node: fx.Node, x: TensorValue, src: TensorValue, dim: int = 0,
                   start: int | None = None, end: int | None = None, step: int = 1) -> Lazy:
    """x with x[..., start:end:step, ...] replaced by src: a where over the index range (whose ends may
    be size expressions: symbolic attention pads its bias rows this way)."""
    shape = out_shape(node)
    n = len(shape)
    dim = dim + n if dim < 0 else dim
    s = 0 if start is None else start
    if isinstance(shape[dim], (int, sympy.Integer)) and isinstance(s, int):
        size = int(shape[dim])
        s = max(0, min(size, s + size if s < 0 else s))
    elif isinstance(s, int) and s < 0:
        raise NotLowered("slice_scatter from the end of a symbolic dim")  # its clamp is a Max: through ATen
    elif not isinstance(s, int):
        s = symbolic_start(node, 3, s, dim)
    length = src.shape[dim]
    d = out_dtype(node)
    iv = list(index_vars("i", n))
    i = IndexValue(iv[dim], torch.int64)
    cond = op("lt", i, size_value(s + step * length, torch.int64), dtype=torch.bool)
    if s != 0:
        cond = op("logical_and", op("ge", i, size_value(s, torch.int64), dtype=torch.bool), cond, dtype=torch.bool)
    if step != 1:
        off = IndexValue(iv[dim] - s, torch.int64)
        cond = op("logical_and", cond, op("eq", op("mod", off, Constant(step, torch.int64), dtype=torch.int64),
                                          Constant(0, torch.int64), dtype=torch.bool), dtype=torch.bool)
    sidx = list(iv)
    sidx[dim] = FloorDiv(iv[dim] - s, step) if step != 1 else iv[dim] - s
    return Lazy(shape, d, op("where", cond, cast(value_at(src, sidx), d), cast(value_at(x, iv), d), dtype=d))


def _select_scatter(ctx: LoweringContext, node: fx.Node, x: TensorValue, src: TensorValue, dim: int,
                    index: int) -> Lazy:
    shape = out_shape(node)
    n = len(shape)
    dim = dim + n if dim < 0 else dim
    index = int(index) + (int(shape[dim]) if int(index) < 0 else 0)
    d = out_dtype(node)
    iv = list(index_vars("i", n))
    cond = op("eq", IndexValue(iv[dim], torch.int64), Constant(index, torch.int64), dtype=torch.bool)
    sidx = iv[:dim] + iv[dim + 1:]
    return Lazy(shape, d, op("where", cond, cast(value_at(src, sidx), d), cast(value_at(x, iv), d), dtype=d))


RULES["aten.slice_scatter.default"] = _slice_scatter
RULES["aten.select_scatter.default"] = _select_scatter


def _scatter_node(ctx: LoweringContext, node: fx.Node, x: TensorValue, src_shape: tuple, dest: list,
                  value: Expr, mode: str) -> TensorValue:
    """Lower to a Scatter node: ``dest`` holds per-dim sympy indices (over r*) or index Exprs."""
    from ..ir import Layout, Scatter
    shape = out_shape(node)
    d = out_dtype(node)
    layout = Layout.contiguous(shape, d)
    flat = sympy.Integer(0)
    indirect: list[Expr] = []
    for k, (i, st) in enumerate(zip(dest, layout.stride)):
        if isinstance(i, sympy.Expr):
            flat = flat + i * st
        else:
            flat = flat + index_var("d", len(indirect)) * st
            indirect.append(_wrap(i, shape[k], _checked(ctx)))
    base = cast(value_at(x, list(index_vars("i", len(shape)))), d)
    data = Scatter(shape, base, tuple(src_shape), sympy.expand(flat), tuple(indirect), value, mode)
    return ctx.computed(layout, data)


def _to_r(e: Expr, n: int) -> Expr:
    """Rename a body over i* (the source space) to r*."""
    from ..ir import substitute_index
    return substitute_index(e, dict(zip(index_vars("i", n), index_vars("r", n))))


def _scatter(mode: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, index: TensorValue,
             src: TensorValue | float | bool, reduce: str | None = None, *, include_self: bool = True) -> TensorValue:
        m = mode
        if reduce is not None:
            if reduce in ("sum", "add") and include_self:
                m = "add"
            else:
                raise NotLowered(f"scatter reduce={reduce!r} include_self={include_self}")
        n = len(x.shape)
        if n == 0 or len(index.shape) == 0:
            raise NotLowered("0-d scatter")
        dim = dim + n if dim < 0 else dim
        rv = list(index_vars("r", len(index.shape)))
        iv = list(index_vars("i", len(index.shape)))
        d = out_dtype(node)
        value = cast(value_at(src, iv), d) if not isinstance(src, (int, float, bool)) else \
            cast(Constant(src, torch.float64 if isinstance(src, float) else torch.int64), d)
        dest: list = list(rv)
        dest[dim] = _to_r(value_at(index, iv), len(iv))
        return _scatter_node(ctx, node, x, tuple(index.shape), dest, _to_r(value, len(iv)), m)
    return rule


RULES["aten.scatter.src"] = _scatter("store")
RULES["aten.scatter.value"] = _scatter("store")
RULES["aten.scatter_add.default"] = _scatter("add")
RULES["aten.scatter_reduce.two"] = _scatter("store")


def _index_put_scatter(node: fx.Node, x: TensorValue, indices: Sequence[TensorValue | None],
                       values: TensorValue) -> tuple[int, tuple, list, Expr]:
    """(first indexed dim, source shape, destination per dim, value) of an ``index_put`` whose tensor
    indices sit at adjacent dims (the dims before and after them: slices ``:``), for ``_scatter_node``.
    Raises NotLowered for mask indices, gaps between indexed dims, and symbolic index shapes that broadcast."""
    idx_pos = [k for k, t in enumerate(indices) if t is not None]
    if not idx_pos or any(indices[k].dtype in (torch.bool, torch.uint8) for k in idx_pos):  # type: ignore[union-attr]
        raise NotLowered("index_put with a boolean mask or no index")
    if idx_pos != list(range(idx_pos[0], idx_pos[-1] + 1)):
        raise NotLowered("index_put with indices at dims that are not adjacent")
    shapes = [tuple(indices[k].shape) for k in idx_pos]  # type: ignore[union-attr]
    if all(sh == shapes[0] for sh in shapes):
        b_shape: tuple = shapes[0]  # (symbolic too: indices of one shape need no broadcast)
    elif all(isinstance(n, sympy.Integer) for sh in shapes for n in sh):
        b_shape = tuple(sympy.Integer(n) for n in torch.broadcast_shapes(*(tuple(int(n) for n in sh)
                                                                          for sh in shapes)))
    else:
        raise NotLowered("index_put with symbolic index shapes that broadcast")
    k0, k1 = idx_pos[0], idx_pos[-1] + 1
    src_shape = tuple(x.shape[:k0]) + tuple(b_shape) + tuple(x.shape[k1:])
    iv = list(index_vars("i", len(src_shape)))
    rv = list(index_vars("r", len(src_shape)))
    bvars = iv[k0:k0 + len(b_shape)]
    dest: list = rv[:k0] + [_to_r(broadcast_at(indices[k], bvars), len(iv)) for k in idx_pos]  # type: ignore[arg-type]
    dest += rv[k0 + len(b_shape):]
    return k0, src_shape, dest, _to_r(broadcast_at(values, iv, out_dtype(node)), len(iv))


def _index_put(ctx: LoweringContext, node: fx.Node, x: TensorValue, indices: Sequence[TensorValue | None],
               values: TensorValue, accumulate: bool = False) -> TensorValue:
    if not accumulate:
        raise NotLowered("index_put without accumulate (duplicate indices make the result order-dependent)")
    k0, src_shape, dest, value = _index_put_scatter(node, x, indices, values)
    if k0 != 0:
        raise NotLowered("index_put with indices that do not start at dim 0")
    return _scatter_node(ctx, node, x, src_shape, dest, value, "add")


RULES["aten.index_put.default"] = _index_put
RULES["aten._unsafe_index_put.default"] = _index_put


def _index_put_inplace(ctx: LoweringContext, node: fx.Node, x: TensorValue, indices: Sequence[TensorValue | None],
                       values: TensorValue, accumulate: bool = False) -> TensorValue:
    """``index_put_`` on a graph input (graph_passes/reinplace.py makes it: a KV cache's ``index_copy_``,
    ``cache[:, :, pos] = kv``) as a scatter whose base is the input itself; ``plan_inplace_scatters``
    (scheduler/inplace.py) then writes it into the input's memory, storing only the indexed elements.
    Indices may start at any dim; without ``accumulate`` a repeated index keeps one of its values (as
    eager on CUDA; the C++ kernels keep the last). Refused (ATen's in-place op runs): a non-contiguous or
    offset input, mask indices, values or indices that read the input (the stores would race the reads)."""
    if not _new_value_of_its_input(node):
        raise NotLowered("index_put_ that is not a graph input's new value (its in-place write stays ATen's)")
    inputs = {b.name for b in ctx.inputs}
    if not (isinstance(x, Strided) and x.buffer in inputs and x.offset == 0
            and tuple(x.stride) == tuple(contiguous_strides(x.shape))):
        raise NotLowered("index_put_ on a value that is not a contiguous graph input")
    _, src_shape, dest, value = _index_put_scatter(node, x, indices, values)
    if any(ld.buffer == x.buffer for e in (value, *(d for d in dest if not isinstance(d, sympy.Expr)))
           for ld in reads(e)):
        raise NotLowered("index_put_ whose values or indices read the tensor it writes")
    return _scatter_node(ctx, node, x, src_shape, dest, value, "add" if accumulate else "store")


def _new_value_of_its_input(node: fx.Node) -> bool:
    """Whether ``node`` (an ``index_put_``) is what graph_passes/reinplace.py makes: the new value of the
    graph input it writes, returned as that input's mutation (``GraphAnnotations.input_mutations``), the
    input read by nothing else. Then the scatter may compute it as a value (written in place by
    ``plan_inplace_scatters``); any other in-place write (a graph traced with one, read again after it)
    stays ATen's, whose write the later reads see."""
    target = node.args[0]
    gm = node.graph.owning_module
    if not isinstance(target, fx.Node) or target.op != "placeholder" or len(target.users) != 1 or gm is None:
        return False
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
    result = node.graph.output_node().args[0]
    outs = result if isinstance(result, (tuple, list)) else (result,)
    return any(o < len(outs) and outs[o] is node and i < len(placeholders) and placeholders[i] is target
               for o, i in annotations_of(gm).input_mutations)


RULES["aten.index_put_.default"] = _index_put_inplace
