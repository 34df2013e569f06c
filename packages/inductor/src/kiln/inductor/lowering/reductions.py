"""Lowering rules for reductions: sum/mean/prod, amax/amin, argmax/argmin, max/min.dim, any/all, var/std.

A reduction is realized at once (its result is a buffer); pointwise work feeding it is inlined into
its body, and pointwise consumers read the result lazily (the scheduler fuses them as epilogues).
var/std are two-pass (mean, then the sum of squared deviations) rather than a one-pass Welford
update: the row kernel re-reads the row from cache, and both passes vectorise.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
from torch import fx

from ..ir import Constant, Expr, Layout, Reduction, cast, index_vars, op, product
from .common import Rule, out_dtype, size_value, upcast
from .context import LoweringContext
from .values import Lazy, Strided, TensorValue, value_at

RULES: dict[str, Rule] = {}
Dims = int | Sequence[int] | None  # a reduction's dim argument: one, several, or all (None)


def norm_dims(dims: Dims, n: int) -> list[int]:
    if n == 0:
        return []  # a 0-d tensor reduces over nothing (dim 0 / -1 name it)
    if dims is None:
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    out = sorted({(d + n if d < 0 else d) for d in dims})
    return out if out else list(range(n))


def reduce(ctx: LoweringContext, x: TensorValue, dims: Sequence[int], rtype: str, dtype: torch.dtype,
           body_dtype: torch.dtype, keepdim: bool = False, body_fn=None) -> TensorValue:
    """Reduce ``x`` over ``dims`` (normalized); ``body_fn(value, kept_index)`` transforms each element."""
    n = len(x.shape)
    kept = [k for k in range(n) if k not in dims]
    ivars, rvars = index_vars("i", len(kept)), index_vars("r", len(dims))
    idx: list[sympy.Expr] = [sympy.Integer(0)] * n
    for j, k in enumerate(kept):
        idx[k] = ivars[j]
    # over size-1 dims only (a global average pool of a 1x1 map): one element, read directly; as a
    # reduction with nothing to iterate it reached the Triton backend as a reduction without a row
    single = all(x.shape[k] == 1 for k in dims)
    for j, k in enumerate(dims):
        idx[k] = sympy.Integer(0) if single else rvars[j]
    body: Expr = cast(value_at(x, idx), body_dtype)
    if body_fn is not None:
        body = body_fn(body, list(ivars))
    ranges = tuple(x.shape[k] for k in kept)
    rranges = tuple(x.shape[k] for k in dims)
    if n == 0 or not dims or single:
        shape = ranges
        val: TensorValue = Lazy(shape, dtype, cast(body if rtype not in ("argmax", "argmin") else
                                                    Constant(0, torch.int64), dtype))
    else:
        val = ctx.computed(Layout.contiguous(ranges, dtype), Reduction(ranges, rranges, rtype, body))
    return keep_dims(val, n, dims) if keepdim else val


def keep_dims(v: TensorValue, n: int, dims: Sequence[int]) -> TensorValue:
    """Insert the reduced dims back as size 1."""
    shape: list[sympy.Expr] = []
    it = iter(range(len(v.shape)))
    pos = []
    for k in range(n):
        if k in dims:
            shape.append(sympy.Integer(1))
        else:
            pos.append(next(it))
            shape.append(v.shape[pos[-1]])
    if isinstance(v, Strided):
        st_it = iter(v.stride)
        st = tuple(sympy.Integer(1) if k in dims else next(st_it) for k in range(n))
        return Strided(v.buffer, tuple(shape), st, v.offset, v.dtype)
    vs = index_vars("i", n)
    return Lazy(tuple(shape), v.dtype, value_at(v, [vs[k] for k in range(n) if k not in dims]))


def _sum(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Dims = None, keepdim: bool = False,
         *, dtype: torch.dtype | None = None) -> TensorValue:
    d = out_dtype(node)
    return reduce(ctx, x, norm_dims(dims, len(x.shape)), "sum", d, upcast(d), keepdim)


def mean(ctx: LoweringContext, x: TensorValue, dims: list[int], keepdim: bool, d: torch.dtype) -> TensorValue:
    cd = upcast(d)
    s = reduce(ctx, x, dims, "sum", cd, cd, keepdim)
    count = product([x.shape[k] for k in dims]) if x.shape else sympy.Integer(1)
    return Lazy(s.shape, d, cast(op("truediv", value_at(s, index_vars("i", len(s.shape))),
                                    size_value(count, cd), dtype=cd), d))


def _mean(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Dims = None, keepdim: bool = False,
          *, dtype: torch.dtype | None = None) -> TensorValue:
    return mean(ctx, x, norm_dims(dims, len(x.shape)), keepdim, out_dtype(node))


RULES["aten.sum.dim_IntList"] = _sum
RULES["aten.sum.default"] = lambda ctx, node, x, *, dtype=None: _sum(ctx, node, x, None)
RULES["aten.mean.dim"] = _mean
RULES["aten.mean.default"] = lambda ctx, node, x, *, dtype=None: _mean(ctx, node, x, None)


def _minmax(rtype: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Dims = None,
             keepdim: bool = False) -> TensorValue:
        d = out_dtype(node)
        return reduce(ctx, x, norm_dims(dims if dims != [] else None, len(x.shape)), rtype, d, upcast(x.dtype),
                      keepdim)
    return rule


RULES["aten.amax.default"] = _minmax("max")
RULES["aten.amin.default"] = _minmax("min")
RULES["aten.max.default"] = lambda ctx, node, x: _minmax("max")(ctx, node, x)
RULES["aten.min.default"] = lambda ctx, node, x: _minmax("min")(ctx, node, x)


def _arg(rtype: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int | None = None,
             keepdim: bool = False) -> TensorValue:
        n = len(x.shape)
        if dim is None:
            r = reduce(ctx, x, list(range(n)), rtype, torch.int64, upcast(x.dtype))
            if keepdim:
                return keep_dims(r, n, list(range(n)))
            return r
        return reduce(ctx, x, norm_dims(dim, n), rtype, torch.int64, upcast(x.dtype), keepdim)
    return rule


RULES["aten.argmax.default"] = _arg("argmax")
RULES["aten.argmin.default"] = _arg("argmin")


def _minmax_dim(rtype: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
        n = len(x.shape)
        dims = norm_dims(dim, n)
        vals = reduce(ctx, x, dims, rtype, x.dtype, upcast(x.dtype), keepdim)
        idx = reduce(ctx, x, dims, "arg" + rtype, torch.int64, upcast(x.dtype), keepdim)
        return (vals, idx)
    return rule


RULES["aten.max.dim"] = _minmax_dim("max")
RULES["aten.min.dim"] = _minmax_dim("min")


def _prod(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int | None = None, keepdim: bool = False,
          *, dtype: torch.dtype | None = None) -> TensorValue:
    d = out_dtype(node)
    return reduce(ctx, x, norm_dims(dim, len(x.shape)), "prod", d, upcast(d), keepdim)


RULES["aten.prod.default"] = lambda ctx, node, x, *, dtype=None: _prod(ctx, node, x)
RULES["aten.prod.dim_int"] = _prod


def _bool_reduce(rtype: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Dims = None,
             keepdim: bool = False) -> TensorValue:
        d = out_dtype(node)
        r = reduce(ctx, x, norm_dims(dims, len(x.shape)), rtype, torch.bool, torch.bool, keepdim)
        if d != torch.bool:  # any/all of uint8 return uint8
            return Lazy(r.shape, d, cast(value_at(r, index_vars("i", len(r.shape))), d))
        return r
    return rule


for _ov in ("default", "dim", "dims"):
    RULES[f"aten.any.{_ov}"] = _bool_reduce("any")
    RULES[f"aten.all.{_ov}"] = _bool_reduce("all")


def variance(ctx: LoweringContext, x: TensorValue, dims: list[int], correction: float, keepdim: bool,
             d: torch.dtype) -> tuple[TensorValue, TensorValue]:
    """(var, mean) by two passes; both keep dims when ``keepdim``."""
    cd = upcast(d)
    m = mean(ctx, x, dims, False, cd)
    count = product([x.shape[k] for k in dims])

    def dev2(v: Expr, kept: list[sympy.Expr]) -> Expr:
        diff = op("sub", v, value_at(m, kept), dtype=cd)
        return op("mul", diff, diff, dtype=cd)
    ss = reduce(ctx, x, dims, "sum", cd, cd, False, dev2)
    iv = index_vars("i", len(ss.shape))
    if isinstance(count, sympy.Integer):
        denom: Expr = Constant(max(float(count) - correction, 0.0), cd)
    else:  # symbolic count: max(n - correction, 0) computed per call
        denom = op("maximum", op("sub", size_value(count, cd), Constant(correction, cd), dtype=cd),
                   Constant(0.0, cd), dtype=cd)
    var = Lazy(ss.shape, d, cast(op("truediv", value_at(ss, iv), denom, dtype=cd), d))
    mean_d = Lazy(m.shape, d, cast(value_at(m, iv), d))
    if keepdim:
        return keep_dims(var, len(x.shape), dims), keep_dims(mean_d, len(x.shape), dims)
    return var, mean_d


def _var(kind: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Dims = None, *,
             correction: float | None = None, keepdim: bool = False) -> object:
        d = out_dtype(node) if kind != "var_mean" else node.meta["val"][0].dtype
        corr = 1.0 if correction is None else float(correction)
        var, m = variance(ctx, x, norm_dims(dims, len(x.shape)), corr, keepdim, d)
        if kind == "std":
            cd = upcast(d)
            iv = index_vars("i", len(var.shape))
            return Lazy(var.shape, d, cast(op("sqrt", cast(value_at(var, iv), cd), dtype=cd), d))
        return (var, m) if kind == "var_mean" else var
    return rule


RULES["aten.var.correction"] = _var("var")
RULES["aten.std.correction"] = _var("std")
RULES["aten.var_mean.correction"] = _var("var_mean")
