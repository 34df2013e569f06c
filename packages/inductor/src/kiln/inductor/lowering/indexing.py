"""Lowering rules for gathers (embedding, index_select, gather, index.Tensor), cat and constant_pad_nd.

Gathers become indirect loads: the index reads symbols ``d0..`` bound to loaded index values.
cat and pad become ``where`` chains over index ranges; codegen never evaluates an untaken branch's load.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
from torch import fx

from ..ir import Constant, Expr, IndexExpr, IndexValue, Load, cast, index_var, index_vars, op
from .common import Rule, out_dtype, out_shape
from .context import LoweringContext, NotLowered
from .values import Lazy, Strided, TensorValue, broadcast_at, value_at

RULES: dict[str, Rule] = {}


def _wrap(idx: Expr, size: IndexExpr) -> Expr:
    """Negative indices count from the end."""
    i = cast(idx, torch.int64)
    return op("where", op("lt", i, Constant(0, torch.int64), dtype=torch.bool),
              op("add", i, Constant(int(size), torch.int64), dtype=torch.int64), i, dtype=torch.int64)


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
            indirect.append(_wrap(i, xs.shape[k]))
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
    if n == 0:
        return Lazy(shape, x.dtype, gather_load(ctx, x, []))
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


def _cat(ctx: LoweringContext, node: fx.Node, tensors: Sequence[TensorValue], dim: int = 0) -> Lazy:
    shape = out_shape(node)
    n = len(shape)
    dim = dim + n if dim < 0 else dim
    parts = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)]
    if len(parts) > 16:
        raise NotLowered(f"cat of {len(parts)} tensors (a where-chain this long is slower than a copy)")
    d = out_dtype(node)
    iv = list(index_vars("i", n))
    starts, pos = [], sympy.Integer(0)
    for t in parts:
        starts.append(pos)
        pos = pos + t.shape[dim]
    body: Expr | None = None
    for t, s in reversed(list(zip(parts, starts))):
        idx = list(iv)
        idx[dim] = iv[dim] - s
        val = cast(value_at(t, idx), d)
        if body is None:
            body = val
        else:
            cond = op("lt", IndexValue(iv[dim], torch.int64), Constant(int(s + t.shape[dim]), torch.int64),
                      dtype=torch.bool)
            body = op("where", cond, val, body, dtype=d)
    assert body is not None
    return Lazy(shape, d, body)


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
            conds.append(op("lt", IndexValue(iv[k], torch.int64), Constant(int(x.shape[k]) + lo, torch.int64),
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
