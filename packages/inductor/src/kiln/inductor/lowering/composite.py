"""Lowerings of common composite ops (softmax, layer_norm, batch_norm inference, logsumexp).

kiln.decomp rewrites these into core ops; lowering them directly as well keeps graphs that still
contain them (a custom table, or before decomposition) on fused kernels instead of fallbacks.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
from torch import fx

from ..ir import Constant, Expr, cast, index_vars, op
from .common import Rule, out_dtype, upcast
from .context import LoweringContext, NotLowered
from .reductions import Dims, keep_dims, norm_dims, reduce, variance
from .values import Lazy, TensorValue, broadcast_at, value_at

RULES: dict[str, Rule] = {}


def _softmax(log: bool):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, half_to_float: bool = False) -> Lazy:
        d = out_dtype(node)
        cd = upcast(d)
        dims = norm_dims(dim, len(x.shape))
        n = len(x.shape)
        iv = list(index_vars("i", n))
        m = reduce(ctx, x, dims, "max", cd, cd, keepdim=True)

        def shifted(v: Expr, kept: list[sympy.Expr]) -> Expr:
            full = list(kept)
            for k in dims:
                full.insert(k, sympy.Integer(0))
            return op("exp", op("sub", v, value_at(m, full), dtype=cd), dtype=cd)
        s = reduce(ctx, x, dims, "sum", cd, cd, keepdim=True, body_fn=shifted)
        xv = cast(value_at(x, iv), cd)
        centered = op("sub", xv, broadcast_at(m, iv), dtype=cd)
        if log:
            body = op("sub", centered, op("log", broadcast_at(s, iv), dtype=cd), dtype=cd)
        else:
            # multiply by the row's reciprocal: one division per row instead of per element
            inv = op("reciprocal", broadcast_at(s, iv), dtype=cd)
            body = op("mul", op("exp", centered, dtype=cd), inv, dtype=cd)
        return Lazy(tuple(x.shape), d, cast(body, d))
    return rule


RULES["aten._softmax.default"] = _softmax(False)
RULES["aten._log_softmax.default"] = _softmax(True)
RULES["aten.softmax.int"] = lambda ctx, node, x, dim, dtype=None: _softmax(False)(ctx, node, x, dim)
RULES["aten.log_softmax.int"] = lambda ctx, node, x, dim, dtype=None: _softmax(True)(ctx, node, x, dim)


def _layer_norm(ctx: LoweringContext, node: fx.Node, x: TensorValue, normalized_shape: Sequence[int],
                weight: TensorValue | None, bias: TensorValue | None, eps: float) -> tuple:
    d = x.dtype
    cd = upcast(d)
    n = len(x.shape)
    dims = list(range(n - len(normalized_shape), n))
    var, mean = variance(ctx, x, dims, 0.0, True, cd)
    iv = list(index_vars("i", n))
    rstd_body = op("rsqrt", op("add", value_at(var, iv[:len(var.shape)]), Constant(float(eps), cd), dtype=cd),
                   dtype=cd)
    rstd = Lazy(var.shape, cd, rstd_body)
    y = op("mul", op("sub", cast(value_at(x, iv), cd), broadcast_at(mean, iv), dtype=cd),
           broadcast_at(rstd, iv), dtype=cd)
    if weight is not None:
        y = op("mul", y, broadcast_at(weight, iv, cd), dtype=cd)
    if bias is not None:
        y = op("add", y, broadcast_at(bias, iv, cd), dtype=cd)
    stat_dtype = node.meta["val"][1].dtype
    mean_o = Lazy(mean.shape, stat_dtype, cast(value_at(mean, list(index_vars("i", len(mean.shape)))), stat_dtype))
    rstd_o = Lazy(rstd.shape, stat_dtype, cast(value_at(rstd, list(index_vars("i", len(rstd.shape)))), stat_dtype))
    return (Lazy(tuple(x.shape), d, cast(y, d)), mean_o, rstd_o)


RULES["aten.native_layer_norm.default"] = _layer_norm


def _batch_norm_infer(ctx: LoweringContext, node: fx.Node, x: TensorValue, weight: TensorValue | None,
                      bias: TensorValue | None, running_mean: TensorValue, running_var: TensorValue,
                      *rest: float | bool) -> tuple:
    """Inference batch norm (training=False): per-channel affine with the running statistics."""
    training = rest[0] if len(rest) == 3 else False
    if training:
        raise NotLowered("training-mode batch norm (decomposed by kiln.decomp)")
    eps = float(rest[-1])
    d = x.dtype
    cd = upcast(d)
    iv = list(index_vars("i", len(x.shape)))
    c = [iv[1]] if len(x.shape) > 1 else [iv[0]]
    inv = op("rsqrt", op("add", cast(value_at(running_var, c), cd), Constant(eps, cd), dtype=cd), dtype=cd)
    y = op("mul", op("sub", cast(value_at(x, iv), cd), cast(value_at(running_mean, c), cd), dtype=cd), inv, dtype=cd)
    if weight is not None:
        y = op("mul", y, cast(value_at(weight, c), cd), dtype=cd)
    if bias is not None:
        y = op("add", y, cast(value_at(bias, c), cd), dtype=cd)
    empty = Lazy((sympy.Integer(0),), cd, Constant(0.0, cd))
    return (Lazy(tuple(x.shape), d, cast(y, d)), empty, empty)


RULES["aten._native_batch_norm_legit_no_training.default"] = lambda ctx, node, x, w, b, rm, rv, mom, eps: \
    _batch_norm_infer(ctx, node, x, w, b, rm, rv, mom, eps)
RULES["aten.native_batch_norm.default"] = _batch_norm_infer


def _logsumexp(ctx: LoweringContext, node: fx.Node, x: TensorValue, dims: Dims, keepdim: bool = False) -> Lazy:
    d = out_dtype(node)
    cd = upcast(d) if d.is_floating_point else torch.float32
    nd = norm_dims(dims, len(x.shape))
    m = reduce(ctx, x, nd, "max", cd, cd, keepdim=False)

    def shifted(v: Expr, kept: list[sympy.Expr]) -> Expr:
        mv = value_at(m, kept)
        safe = op("where", op("isinf", mv, dtype=torch.bool), Constant(0.0, cd), mv, dtype=cd)
        return op("exp", op("sub", v, safe, dtype=cd), dtype=cd)
    s = reduce(ctx, x, nd, "sum", cd, cd, keepdim=False, body_fn=shifted)
    iv = list(index_vars("i", len(s.shape)))
    mv = value_at(m, iv)
    safe = op("where", op("isinf", mv, dtype=torch.bool), Constant(0.0, cd), mv, dtype=cd)
    out = Lazy(s.shape, d, cast(op("add", op("log", value_at(s, iv), dtype=cd), safe, dtype=cd), d))
    return keep_dims(out, len(x.shape), nd) if keepdim else out  # type: ignore[return-value]


RULES["aten.logsumexp.default"] = _logsumexp
