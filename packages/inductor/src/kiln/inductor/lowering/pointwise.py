"""Lowering rules for elementwise ATen ops: math, arithmetic, comparisons, logic, where, casts, fills."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch import fx

from ..ir import Constant, Expr, IndexValue, cast, index_vars, op
from .common import Rule, meta, out_dtype, out_shape, pointwise, promote, scalar_value, upcast
from .context import LoweringContext, NotLowered
from .values import Lazy, TensorValue, is_tensor

RULES: dict[str, Rule] = {}


def _unary(ir_name: str, kind: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, *_, **__) -> Lazy:
        d = out_dtype(node)
        if kind == "rounding" and not d.is_floating_point:
            return pointwise(node, [x], lambda a: a, d)
        if kind == "predicate":  # isnan(x) -> bool: compute in the input's type
            cd = upcast(x.dtype)
            return pointwise(node, [x], lambda a: op(ir_name, a, dtype=torch.bool), cd, torch.bool)
        cd = upcast(d)
        return pointwise(node, [x], lambda a: op(ir_name, a, dtype=cd), cd)
    return rule


for _name in ("exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
              "asinh acosh atanh erf erfc sigmoid reciprocal neg abs sign lgamma relu frac").split():
    RULES[f"aten.{_name}.default"] = _unary(_name, "math")
for _name in ("floor", "ceil", "trunc", "round"):
    RULES[f"aten.{_name}.default"] = _unary(_name, "rounding")
for _name in ("isnan", "isinf", "isfinite"):
    RULES[f"aten.{_name}.default"] = _unary(_name, "predicate")
RULES["aten.bitwise_not.default"] = lambda ctx, node, x: pointwise(
    node, [x], lambda a: op("bitwise_not" if x.dtype != torch.bool else "logical_not", a,
                            dtype=out_dtype(node)), out_dtype(node))
RULES["aten.logical_not.default"] = lambda ctx, node, x: pointwise(
    node, [x], lambda a: op("logical_not", a, dtype=torch.bool), torch.bool)


def _binary(ir_name: str, alpha: bool = False):
    def rule(ctx: LoweringContext, node: fx.Node, a: object, b: object, *rest, **kw) -> Lazy:
        d = out_dtype(node)
        cd = upcast(d)
        al = kw.get("alpha", rest[0] if rest else 1) if alpha else 1

        def fn(x: Expr, y: Expr) -> Expr:
            if not (isinstance(al, (int, float)) and al == 1):
                y = op("mul", y, scalar_value(al, cd), dtype=cd)
            return op(ir_name, x, y, dtype=cd)
        return pointwise(node, [a, b], fn, cd)
    return rule


for _ov in ("Tensor", "Scalar"):
    RULES[f"aten.add.{_ov}"] = _binary("add", alpha=True)
    RULES[f"aten.sub.{_ov}"] = _binary("sub", alpha=True)
    RULES[f"aten.mul.{_ov}"] = _binary("mul")
    RULES[f"aten.div.{_ov}"] = _binary("truediv")
    RULES[f"aten.remainder.{_ov}"] = _binary("mod")
    RULES[f"aten.fmod.{_ov}"] = _binary("fmod")
RULES["aten.rsub.Scalar"] = lambda ctx, node, a, b, alpha=1: _binary("sub", alpha=True)(ctx, node, b, a, alpha)
RULES["aten.rsub.Tensor"] = RULES["aten.rsub.Scalar"]
# hypot as one op: sqrt(x * x + y * y) overflows for |x| > 1.8e19 in float32 (hypot(1e30, 1e30) gave inf)
for _name in ("maximum", "minimum", "atan2", "copysign", "hypot"):
    RULES[f"aten.{_name}.default"] = _binary(_name)
RULES["aten.atan2.default"] = _binary("atan2")


def _div_mode(ctx: LoweringContext, node: fx.Node, a: object, b: object, *, rounding_mode: str | None = None):
    name = {"trunc": "truncdiv", "floor": "floordiv", None: "truediv"}[rounding_mode]
    return _binary(name)(ctx, node, a, b)


RULES["aten.div.Tensor_mode"] = _div_mode
RULES["aten.div.Scalar_mode"] = _div_mode
RULES["aten.floor_divide.default"] = lambda ctx, node, a, b: _binary("floordiv")(ctx, node, a, b)


def _pow(ctx: LoweringContext, node: fx.Node, a: object, b: object) -> Lazy:
    d = out_dtype(node)
    cd = upcast(d)
    if is_tensor(a) and isinstance(b, (int, float)) and not isinstance(b, bool):
        special: dict[float, Callable[[Any], Any]] = {2: lambda x: op("mul", x, x, dtype=cd), 1: lambda x: x,
                   3: lambda x: op("mul", op("mul", x, x, dtype=cd), x, dtype=cd)}
        if cd.is_floating_point:
            special.update({0.5: lambda x: op("sqrt", x, dtype=cd), -0.5: lambda x: op("rsqrt", x, dtype=cd),
                            -1: lambda x: op("reciprocal", x, dtype=cd)})
        if b in special:
            return pointwise(node, [a], special[b], cd)
    return pointwise(node, [a, b], lambda x, y: op("pow", x, y, dtype=cd), cd)


for _ov in ("Tensor_Scalar", "Tensor_Tensor", "Scalar"):
    RULES[f"aten.pow.{_ov}"] = _pow


def _compare(ir_name: str):
    def rule(ctx: LoweringContext, node: fx.Node, a: object, b: object) -> Lazy:
        cd = upcast(promote(a, b))
        return pointwise(node, [a, b], lambda x, y: op(ir_name, x, y, dtype=torch.bool), cd, torch.bool)
    return rule


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    RULES[f"aten.{_name}.Tensor"] = _compare(_name)
    RULES[f"aten.{_name}.Scalar"] = _compare(_name)


def _logical(ir_name: str):
    def rule(ctx: LoweringContext, node: fx.Node, a: object, b: object) -> Lazy:
        return pointwise(node, [a, b], lambda x, y: op(ir_name, x, y, dtype=torch.bool), torch.bool, torch.bool)
    return rule


for _name in ("logical_and", "logical_or", "logical_xor"):
    RULES[f"aten.{_name}.default"] = _logical(_name)


def _bitwise(ir_name: str, logical: str):
    def rule(ctx: LoweringContext, node: fx.Node, a: object, b: object) -> Lazy:
        d = out_dtype(node)
        name = logical if d == torch.bool else ir_name
        return pointwise(node, [a, b], lambda x, y: op(name, x, y, dtype=d), d)
    return rule


for _name, _lg in (("bitwise_and", "logical_and"), ("bitwise_or", "logical_or"), ("bitwise_xor", "logical_xor")):
    RULES[f"aten.{_name}.Tensor"] = _bitwise(_name, _lg)
    RULES[f"aten.{_name}.Scalar"] = _bitwise(_name, _lg)
RULES["aten.__lshift__.Scalar"] = _bitwise("lshift", "lshift")
RULES["aten.__rshift__.Scalar"] = _bitwise("rshift", "rshift")


def _where(ctx: LoweringContext, node: fx.Node, c: object, a: object, b: object) -> Lazy:
    cd = upcast(out_dtype(node))

    def fn(x: Expr, y: Expr, z: Expr) -> Expr:
        return op("where", cast(x, torch.bool), y, z, dtype=cd)
    shape = out_shape(node)
    idx = index_vars("i", len(shape))
    from .common import operand
    body = fn(operand(c, idx, torch.bool), operand(a, idx, cd), operand(b, idx, cd))
    return Lazy(shape, out_dtype(node), cast(body, out_dtype(node)))


RULES["aten.where.self"] = _where
RULES["aten.where.ScalarSelf"] = _where
RULES["aten.where.ScalarOther"] = _where
RULES["aten.where.Scalar"] = _where


def _masked_fill(ctx: LoweringContext, node: fx.Node, x: TensorValue, mask: TensorValue, value: object) -> Lazy:
    return _where(ctx, node, mask, value, x)


RULES["aten.masked_fill.Scalar"] = _masked_fill
RULES["aten.masked_fill.Tensor"] = _masked_fill


def _clamp(ctx: LoweringContext, node: fx.Node, x: TensorValue, lo: object = None, hi: object = None) -> Lazy:
    cd = upcast(out_dtype(node))
    args = [x] + [v for v in (lo, hi) if v is not None]

    def fn(v: Expr, *bounds: Expr) -> Expr:
        it = iter(bounds)
        if lo is not None:
            v = op("maximum", v, next(it), dtype=cd)
        if hi is not None:
            v = op("minimum", v, next(it), dtype=cd)
        return v
    return pointwise(node, args, fn, cd)


RULES["aten.clamp.default"] = _clamp
RULES["aten.clamp.Tensor"] = _clamp
RULES["aten.clamp_min.default"] = lambda ctx, node, x, lo: _clamp(ctx, node, x, lo, None)
RULES["aten.clamp_max.default"] = lambda ctx, node, x, hi: _clamp(ctx, node, x, None, hi)


def _hardtanh(ctx: LoweringContext, node: fx.Node, x: TensorValue, lo: float = -1.0, hi: float = 1.0) -> Lazy:
    return _clamp(ctx, node, x, lo, hi)


RULES["aten.hardtanh.default"] = _hardtanh


def _copy_like(ctx: LoweringContext, node: fx.Node, x: TensorValue, *args, **kw) -> Lazy:
    v = meta(node)
    src = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if (v.layout != torch.strided or v.device.type not in ("cpu", "cuda")
            or (isinstance(src, torch.Tensor) and src.device != v.device)):  # device transfers run in ATen
        raise NotLowered(f"copy to {v.device}/{v.layout}")
    d = out_dtype(node)
    out = pointwise(node, [x], lambda a: a, d)
    if isinstance(x, Lazy) and x.view_of is not None and isinstance(out, Lazy) and out.shape == x.shape:
        # a cast of a reshaped value is that reshape of the cast source (autocast converts the [B*L, C]
        # view a matmul reads): realizing it can still store it in the source's iteration space
        return Lazy(out.shape, out.dtype, out.body, view_of=_cast_source(x.view_of, d))
    return out


def _cast_source(src: Lazy, dtype: torch.dtype) -> Lazy:
    inner = _cast_source(src.view_of, dtype) if src.view_of is not None else None
    return Lazy(src.shape, dtype, cast(src.body, dtype), view_of=inner)


for _name in ("aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default",
              "aten.contiguous.default", "aten._assert_tensor_metadata.default"):
    RULES[_name] = _copy_like
RULES["aten.copy.default"] = lambda ctx, node, dst, src, non_blocking=False: _copy_like(ctx, node, src)


def _filled(value_of):
    def rule(ctx: LoweringContext, node: fx.Node, *args, **kw) -> Lazy:
        value = value_of(args, kw)
        if is_tensor(value):
            raise NotLowered("fill with a tensor value")
        d = out_dtype(node)
        return Lazy(out_shape(node), d, scalar_value(value, d))
    return rule


_FILLS = {
    "full.default": lambda a, k: a[1] if len(a) > 1 else k["fill_value"],
    "full_like.default": lambda a, k: a[1] if len(a) > 1 else k["fill_value"],
    "fill.Scalar": lambda a, k: a[1] if len(a) > 1 else k["value"],
    "new_full.default": lambda a, k: a[2] if len(a) > 2 else k["fill_value"],
}
for _name in ("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
              "empty_strided.default", "empty_like.default", "new_empty.default", "new_empty_strided.default"):
    _FILLS[_name] = lambda a, k: 0
for _name in ("ones.default", "ones_like.default", "new_ones.default"):
    _FILLS[_name] = lambda a, k: 1
for _name, _fn in _FILLS.items():
    RULES[f"aten.{_name}"] = _filled(_fn)


def _scalar_tensor(ctx: LoweringContext, node: fx.Node, value: object, **kw) -> Lazy:
    d = out_dtype(node)
    return Lazy((), d, scalar_value(value, d))


RULES["aten.scalar_tensor.default"] = _scalar_tensor


def _iota(ctx: LoweringContext, node: fx.Node, length: int, *, start: int = 0, step: int = 1, **kw) -> Lazy:
    (i0,) = index_vars("i", 1)
    d = out_dtype(node)
    return Lazy(out_shape(node), d, cast(IndexValue(i0 * step + start, torch.int64), d))


def _arange(ctx: LoweringContext, node: fx.Node, *args, **kw) -> Lazy:
    """``start + i * step``: in int64 when both are ints (symbolic sizes too), else in float64 as
    ATen accumulates a floating arange (a symbolic float start or step included)."""
    start, step = (0, 1) if len(args) < 2 else (args[0], args[2] if len(args) > 2 else kw.get("step", 1))
    (i0,) = index_vars("i", 1)
    d = out_dtype(node)
    if all(isinstance(v, (int, sympy.Expr)) and not isinstance(v, bool) for v in (start, step)):
        return Lazy(out_shape(node), d, cast(IndexValue(i0 * step + start, torch.int64), d))
    cd = torch.float64
    body = op("add", op("mul", cast(IndexValue(i0, torch.int64), cd), scalar_value(step, cd), dtype=cd),
              scalar_value(start, cd), dtype=cd)
    return Lazy(out_shape(node), d, cast(body, d))


RULES["aten.iota.default"] = _iota
RULES["aten.arange.start_step"] = _arange
RULES["aten.arange.default"] = _arange
RULES["aten.arange.start"] = _arange


# Activations that decomp rewrites into core ops; lowered directly so graphs that still contain them
# (before kiln.decomp runs, or with a custom table) fuse instead of falling back.
def _act(fn_name: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, *args, **kw) -> Lazy:
        cd = upcast(out_dtype(node))

        def c(v: float) -> Expr:
            return Constant(v, cd)

        def f(a: Expr) -> Expr:
            if fn_name == "gelu":
                if kw.get("approximate", args[0] if args else "none") == "tanh":
                    inner = op("mul", c(math.sqrt(2 / math.pi)), op("add", a, op("mul", c(0.044715), op(
                        "mul", a, op("mul", a, a, dtype=cd), dtype=cd), dtype=cd), dtype=cd), dtype=cd)
                    t = op("tanh", inner, dtype=cd)
                else:
                    t = op("erf", op("mul", a, c(1 / math.sqrt(2)), dtype=cd), dtype=cd)
                return op("mul", op("mul", c(0.5), a, dtype=cd), op("add", c(1.0), t, dtype=cd), dtype=cd)
            if fn_name == "silu":
                return op("mul", a, op("sigmoid", a, dtype=cd), dtype=cd)
            if fn_name == "leaky_relu":
                slope = args[0] if args else kw.get("negative_slope", 0.01)
                return op("where", op("gt", a, c(0.0), dtype=torch.bool), a, op("mul", a, c(slope), dtype=cd),
                          dtype=cd)
            if fn_name == "hardsigmoid":
                return op("mul", op("minimum", op("maximum", op("add", a, c(3.0), dtype=cd), c(0.0), dtype=cd),
                                    c(6.0), dtype=cd), c(1 / 6), dtype=cd)
            if fn_name == "hardswish":
                return op("mul", a, op("mul", op("minimum", op("maximum", op("add", a, c(3.0), dtype=cd), c(0.0),
                                                              dtype=cd), c(6.0), dtype=cd), c(1 / 6), dtype=cd),
                          dtype=cd)
            raise AssertionError(fn_name)
        return pointwise(node, [x], f, cd)
    return rule


for _name in ("gelu", "silu", "leaky_relu", "hardsigmoid", "hardswish"):
    RULES[f"aten.{_name}.default"] = _act(_name)


# Ops whose rules read every Python-scalar argument through ``operand``/``scalar_value``: a symbolic
# float argument (``x * (1.0 / n)``) fuses into their kernels. Any other op given one runs as an ATen
# call with the scalar computed by the wrapper (lower.py), so no rule meets a value it cannot read.
SYMBOLIC_FLOAT_OPS: frozenset[str] = frozenset(
    [f"aten.{n}.{ov}" for n in ("add", "sub", "mul", "div", "rsub", "eq", "ne", "lt", "le", "gt", "ge")
     for ov in ("Tensor", "Scalar")]
    + [f"aten.pow.{ov}" for ov in ("Tensor_Scalar", "Tensor_Tensor", "Scalar")]
    + [f"aten.where.{ov}" for ov in ("self", "ScalarSelf", "ScalarOther", "Scalar")]
    + ["aten.masked_fill.Scalar", "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default",
       "aten.full.default", "aten.full_like.default", "aten.fill.Scalar", "aten.new_full.default",
       "aten.scalar_tensor.default", "aten.arange.default", "aten.arange.start", "aten.arange.start_step"])
