"""Lowering rules for views: folded into strides when they can be, else into index arithmetic."""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
from torch import fx

from kiln.graph import view_strides as aten_view_strides

from ..ir import FloorDiv, IndexExpr, ModIndex, as_index, contiguous_strides, index_vars
from .common import Rule, meta, negative_at_example, out_shape, symbolic_start
from .context import LoweringContext, NotLowered
from .values import Lazy, Strided, TensorValue, broadcast_at, value_at

RULES: dict[str, Rule] = {}


def _norm_dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _lazy_from(shape: tuple[IndexExpr, ...], x: TensorValue, idx_of: list[IndexExpr]) -> Lazy:
    return Lazy(shape, x.dtype, value_at(x, idx_of))


def view_strides(old_shape: Sequence[IndexExpr], old_stride: Sequence[IndexExpr],
                 new_shape: Sequence[IndexExpr]) -> tuple[IndexExpr, ...] | None:
    """Strides giving ``new_shape`` over the same memory, or None when a copy is needed."""
    try:
        osz = [int(s) for s in old_shape]
        ost = [int(s) for s in old_stride]
        nsz = [int(s) for s in new_shape]
    except TypeError:
        return _symbolic_view_strides(old_shape, old_stride, new_shape)
    new_st = aten_view_strides(osz, ost, nsz)
    return None if new_st is None else tuple(sympy.Integer(s) for s in new_st)


def _symbolic_view_strides(old_shape: Sequence[IndexExpr], old_stride: Sequence[IndexExpr],
                           new_shape: Sequence[IndexExpr]) -> tuple[IndexExpr, ...] | None:
    """``view_strides`` with symbolic sizes: each group of old dims that one group of new dims
    re-splits must be one contiguous run of memory (provably, for every size); else None (a copy)."""
    groups = _dim_groups(old_shape, new_shape)
    if groups is None:
        return None
    new_st: list[IndexExpr] = [sympy.Integer(1)] * len(new_shape)
    for og, ng in groups:
        for a, b in zip(og, og[1:]):
            if sympy.expand(old_stride[a] - old_stride[b] * old_shape[b]) != 0:
                return None
        inner = contiguous_strides([new_shape[k] for k in ng])
        for k, st in zip(ng, inner):
            new_st[k] = sympy.expand(st * old_stride[og[-1]])
    return tuple(new_st)


def _smaller(a: IndexExpr, b: IndexExpr) -> bool | None:
    """Whether size product ``a`` < ``b`` where one divides the other (None: cannot tell)."""
    if isinstance(a - b, sympy.Integer):
        return bool(a < b)
    num, den = sympy.fraction(sympy.cancel(b / a))
    if den == 1 and num != 1:
        return True  # a divides b (and they differ)
    num, den = sympy.fraction(sympy.cancel(a / b))
    if den == 1 and num != 1:
        return False
    return None


def _dim_groups(old_shape: Sequence[IndexExpr], new_shape: Sequence[IndexExpr]
                ) -> list[tuple[list[int], list[int]]] | None:
    """Runs of old and new dims (size-1 dims left out) with equal products, in order; None when a
    symbolic reshape cannot be grouped provably."""
    old_dims = [k for k, s in enumerate(old_shape) if s != 1]
    new_dims = [k for k, s in enumerate(new_shape) if s != 1]
    groups: list[tuple[list[int], list[int]]] = []
    oi = ni = 0
    while oi < len(old_dims) or ni < len(new_dims):
        if oi >= len(old_dims) or ni >= len(new_dims):
            return None
        og, ng = [old_dims[oi]], [new_dims[ni]]
        oi += 1
        ni += 1
        po, pn = old_shape[og[0]], new_shape[ng[0]]
        while po != pn:
            less = _smaller(po, pn)
            if less is None:
                return None
            if less:
                if oi >= len(old_dims):
                    return None
                og.append(old_dims[oi])
                po = po * old_shape[old_dims[oi]]
                oi += 1
            else:
                if ni >= len(new_dims):
                    return None
                ng.append(new_dims[ni])
                pn = pn * new_shape[new_dims[ni]]
                ni += 1
        groups.append((og, ng))
    return groups


def reshape_index(old_shape: Sequence[IndexExpr], new_shape: Sequence[IndexExpr]) -> list[IndexExpr]:
    """Old-shape indices as functions of new-shape loop variables (grouping dims to avoid div/mod)."""
    new_vars = index_vars("i", len(new_shape))
    groups = _dim_groups(old_shape, new_shape)
    if groups is None:
        raise NotLowered(f"a reshape of symbolic sizes {list(old_shape)} -> {list(new_shape)} that cannot be "
                         "grouped for every size")
    out: list[IndexExpr] = [sympy.Integer(0)] * len(old_shape)
    for og, ng in groups:
        ns = contiguous_strides([new_shape[k] for k in ng])
        flat = sum((new_vars[k] * s for k, s in zip(ng, ns)), sympy.Integer(0))
        os_ = contiguous_strides([old_shape[k] for k in og])
        for j, (k, s) in enumerate(zip(og, os_)):
            q = FloorDiv(flat, s)
            out[k] = q if j == 0 else ModIndex(q, old_shape[k])
    return out


def _view(ctx: LoweringContext, node: fx.Node, x: TensorValue, *args, **kw) -> TensorValue:
    shape = out_shape(node)
    if tuple(shape) == tuple(x.shape):
        return x
    if isinstance(x, Strided):
        st = view_strides(x.shape, x.stride, shape)
        if st is not None:
            return Strided(x.buffer, shape, st, x.offset, x.dtype)
    view = _lazy_from(shape, x, reshape_index(x.shape, shape))
    return Lazy(view.shape, view.dtype, view.body, view_of=x) if isinstance(x, Lazy) else view


for _name in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
              "aten.flatten.using_ints", "aten.unflatten.int", "aten.view.dtype"):
    RULES[_name] = _view


def _view_dtype(ctx: LoweringContext, node: fx.Node, x: TensorValue, dtype: torch.dtype) -> TensorValue:
    raise NotLowered("view as another dtype reinterprets bits")


RULES["aten.view.dtype"] = _view_dtype


def _permute(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    n = len(x.shape)
    dims = [_norm_dim(d, n) for d in dims]
    shape = tuple(x.shape[d] for d in dims)
    if isinstance(x, Strided):
        return Strided(x.buffer, shape, tuple(x.stride[d] for d in dims), x.offset, x.dtype)
    new_vars = index_vars("i", n)
    idx: list[IndexExpr] = [sympy.Integer(0)] * n
    for p, d in enumerate(dims):
        idx[d] = new_vars[p]
    return _lazy_from(shape, x, idx)


RULES["aten.permute.default"] = _permute


def _transpose(ctx: LoweringContext, node: fx.Node, x: TensorValue, d0: int = 0, d1: int = 1) -> TensorValue:
    n = len(x.shape)
    dims = list(range(n))
    if n >= 2:
        a, b = _norm_dim(d0, n), _norm_dim(d1, n)
        dims[a], dims[b] = dims[b], dims[a]
    return _permute(ctx, node, x, dims)


RULES["aten.transpose.int"] = _transpose
RULES["aten.t.default"] = lambda ctx, node, x: _transpose(ctx, node, x, 0, 1)
RULES["aten.numpy_T.default"] = lambda ctx, node, x: _permute(ctx, node, x, list(range(len(x.shape)))[::-1])


def _expand(ctx: LoweringContext, node: fx.Node, x: TensorValue, *args, **kw) -> TensorValue:
    shape = out_shape(node)
    if isinstance(x, Strided):
        lead = len(shape) - len(x.shape)
        st = [sympy.Integer(0)] * lead + [
            (sympy.Integer(0) if (x.shape[k] == 1 and shape[lead + k] != 1) else x.stride[k])
            for k in range(len(x.shape))]
        return Strided(x.buffer, shape, tuple(st), x.offset, x.dtype)
    return Lazy(shape, x.dtype, broadcast_at(x, index_vars("i", len(shape))))


RULES["aten.expand.default"] = _expand
RULES["aten.expand_as.default"] = _expand
RULES["aten.broadcast_to.default"] = _expand


def _slice(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int = 0, start: int | None = None,
           end: int | None = None, step: int = 1) -> TensorValue:
    n = len(x.shape)
    dim = _norm_dim(dim, n)
    s = 0 if start is None else start
    if isinstance(x.shape[dim], (int, sympy.Integer)) and isinstance(s, int):
        size = int(x.shape[dim])
        s = max(0, min(size, s + size if s < 0 else s))
    elif isinstance(s, int) and s < 0:
        raise NotLowered("a slice from the end of a symbolic dim")  # its clamp is a Max: through ATen
    elif not isinstance(s, int):
        s = symbolic_start(node, 2, s, dim)
    shape = out_shape(node)
    if isinstance(x, Strided):
        st = list(x.stride)
        st[dim] = st[dim] * step
        return Strided(x.buffer, shape, tuple(st), sympy.expand(x.offset + s * x.stride[dim]), x.dtype)
    idx = list(index_vars("i", n))
    idx[dim] = idx[dim] * step + s
    return _lazy_from(shape, x, idx)


RULES["aten.slice.Tensor"] = _slice


def _select(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, index: int) -> TensorValue:
    n = len(x.shape)
    dim = _norm_dim(dim, n)
    if isinstance(index, int) and index < 0 or not isinstance(index, int) and negative_at_example(node, 2, index):
        index = index + x.shape[dim]
        index = int(index) if isinstance(index, (int, sympy.Integer)) else index
    shape = out_shape(node)
    if isinstance(x, Strided):
        st = tuple(s for k, s in enumerate(x.stride) if k != dim)
        return Strided(x.buffer, shape, st, sympy.expand(x.offset + index * x.stride[dim]), x.dtype)
    vs = list(index_vars("i", n - 1))
    idx = vs[:dim] + [as_index(index)] + vs[dim:]
    return _lazy_from(shape, x, idx)


RULES["aten.select.int"] = _select


def _restride(ctx: LoweringContext, node: fx.Node, x: TensorValue, *args, **kw) -> TensorValue:
    """squeeze/unsqueeze: same elements, size-1 dims added or removed."""
    shape = out_shape(node)
    if isinstance(x, Strided):
        kept = [s for sz, s in zip(x.shape, x.stride) if sz != 1]
        it = iter(kept)
        st = tuple(sympy.Integer(1) if sz == 1 else next(it) for sz in shape)
        return Strided(x.buffer, shape, st, x.offset, x.dtype)
    return _lazy_from(shape, x, reshape_index(x.shape, shape))


for _name in ("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default", "aten.unsqueeze.default"):
    RULES[_name] = _restride


def _identity(ctx: LoweringContext, node: fx.Node, x: TensorValue, *args, **kw) -> TensorValue:
    return x


for _name in ("aten.alias.default", "aten.detach.default", "aten.lift_fresh.default",
              "aten._assert_tensor_metadata.default"):
    RULES[_name] = _identity


def _as_strided(ctx: LoweringContext, node: fx.Node, x: TensorValue, size: Sequence[int],
                stride: Sequence[int], storage_offset: int | None = None) -> TensorValue:
    xs = x if isinstance(x, Strided) else ctx.realize(x)
    base = ctx.storage_offsets.get(xs.buffer, 0)
    off = xs.offset if storage_offset is None else as_index(int(storage_offset) - base)
    return Strided(xs.buffer, out_shape(node), tuple(as_index(s) for s in stride), off, xs.dtype)


RULES["aten.as_strided.default"] = _as_strided


def _flip(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    n = len(x.shape)
    idx = list(index_vars("i", n))
    for d in dims:
        d = _norm_dim(d, n)
        idx[d] = x.shape[d] - 1 - idx[d]
    return _lazy_from(tuple(x.shape), x, idx)


RULES["aten.flip.default"] = _flip


def _split(ctx: LoweringContext, node: fx.Node, x: TensorValue, sizes: object, dim: int = 0) -> tuple:
    n = len(x.shape)
    dim = _norm_dim(dim, n)
    outs = meta(node)
    parts = []
    start: IndexExpr = sympy.Integer(0)
    for o in outs:
        length = as_index(o.shape[dim])  # never int(): a SymInt would be specialised
        parts.append(_slice_to(ctx, x, dim, start, start + length, tuple(as_index(s) for s in o.shape)))
        start += length
    return tuple(parts)


def _slice_to(ctx: LoweringContext, x: TensorValue, dim: int, s: int, e: int,
              shape: tuple[IndexExpr, ...]) -> TensorValue:
    if isinstance(x, Strided):
        return Strided(x.buffer, shape, x.stride, sympy.expand(x.offset + s * x.stride[dim]), x.dtype)
    idx = list(index_vars("i", len(x.shape)))
    idx[dim] = idx[dim] + s
    return _lazy_from(shape, x, idx)


RULES["aten.split_with_sizes.default"] = _split
RULES["aten.split.Tensor"] = _split


def _unbind(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int = 0) -> tuple:
    n = len(x.shape)
    dim = _norm_dim(dim, n)
    outs = meta(node)
    res: list[TensorValue] = []
    for k, o in enumerate(outs):
        shape = tuple(as_index(s) for s in o.shape)
        if isinstance(x, Strided):
            st = tuple(s for j, s in enumerate(x.stride) if j != dim)
            res.append(Strided(x.buffer, shape, st, sympy.expand(x.offset + k * x.stride[dim]), x.dtype))
        else:
            vs = list(index_vars("i", n - 1))
            res.append(_lazy_from(shape, x, vs[:dim] + [sympy.Integer(k)] + vs[dim:]))
    return tuple(res)


RULES["aten.unbind.int"] = _unbind
