"""Core ATen -> kiln_prims: explicit broadcasting and type promotion, reductions with explicit dims.

Registered in the ``prims`` table (which also holds every core rule, so any ATen graph reaches prims).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .common import aten, canonical_dim, reduction_dims
from .prims import UNARY
from .registry import Family

FAMILY = Family("to_prims")
register = FAMILY.register
P = torch.ops.kiln_prims


def _shape_of(x: Any) -> list[Any]:
    return list(x.shape) if isinstance(x, torch.Tensor) else []


def broadcast_shape(*shapes: Sequence[Any]) -> list[Any]:
    nd = max((len(s) for s in shapes), default=0)
    out: list[Any] = [1] * nd
    for s in shapes:
        for i, d in enumerate(s):
            j = nd - len(s) + i
            if d != 1:
                out[j] = d
    return out


def to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else P.convert_element_type(x, dtype)


def broadcast_to(x: torch.Tensor, shape: Sequence[Any]) -> torch.Tensor:
    if list(x.shape) == list(shape):
        return x
    off = len(shape) - x.dim()
    keep = [i for i in range(x.dim()) if x.shape[i] == shape[off + i]]
    if len(keep) != x.dim():  # size-1 dims that expand: drop them first
        x = P.squeeze(x, [i for i in range(x.dim()) if i not in keep])
    return P.broadcast_in_dim(x, list(shape), [off + i for i in keep])


def operands(*args: Any, dtype: torch.dtype | None = None, device: Any = None) -> list[torch.Tensor]:
    """Tensors and scalars promoted to one dtype (``dtype`` or torch's result type) and broadcast."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dev = device or tensors[0].device
    if dtype is None:
        dtype = _result_type(args)
    shape = broadcast_shape(*[_shape_of(a) for a in args])
    out = []
    for a in args:
        t = a if isinstance(a, torch.Tensor) else P.full([], a, dtype=dtype, device=dev)
        out.append(broadcast_to(to_dtype(t, dtype), shape))
    return out


def _result_type(args: Sequence[Any]) -> torch.dtype:
    """torch's promotion rules (0-dim tensors and Python scalars are weaker than dimensioned tensors)."""
    if len(args) == 1:
        return args[0].dtype
    first = args[0] if isinstance(args[0], torch.Tensor) else args[1]
    other = args[1] if first is args[0] else args[0]
    return torch.result_type(first, other)


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.get_default_dtype()


# -- elementwise -----------------------------------------------------------------------------------
_FLOAT_UNARY = set(UNARY) - {"abs", "neg", "floor", "ceil", "round", "trunc", "sign", "bitwise_not"}


def _make_unary(name: str):
    prim = getattr(P, name)

    def rule(self):
        x = to_dtype(self, _float_dtype(self.dtype)) if name in _FLOAT_UNARY else self
        if name in ("floor", "ceil", "round", "trunc") and not self.dtype.is_floating_point:
            return P.clone(self)
        return prim(x)
    return rule


for _name in UNARY:
    register(getattr(aten, _name).default, table="prims")(_make_unary(_name))


@register(aten.sigmoid.default, table="prims")
def sigmoid(self):
    x = to_dtype(self, _float_dtype(self.dtype))
    one = P.full([], 1, dtype=x.dtype, device=x.device)
    den = P.add(P.exp(P.neg(x)), broadcast_to(one, x.shape))
    return P.reciprocal(den)


def _binary_rule(prim_name: str, compare: bool = False):
    prim = getattr(P, prim_name)

    def rule(self, other, alpha=None):
        if alpha is not None and alpha != 1:
            other = aten.mul.Tensor(other, alpha) if isinstance(other, torch.Tensor) else other * alpha
        a, b = operands(self, other)
        return prim(a, b)
    return rule


for _op, _prim in [(aten.add.Tensor, "add"), (aten.add.Scalar, "add"), (aten.sub.Tensor, "sub"),
                   (aten.sub.Scalar, "sub"), (aten.mul.Tensor, "mul"), (aten.mul.Scalar, "mul"),
                   (aten.maximum.default, "maximum"), (aten.minimum.default, "minimum"),
                   (aten.atan2.default, "atan2"), (aten.fmod.Tensor, "fmod"), (aten.fmod.Scalar, "fmod"),
                   (aten.remainder.Tensor, "remainder"), (aten.remainder.Scalar, "remainder"),
                   (aten.bitwise_and.Tensor, "bitwise_and"), (aten.bitwise_or.Tensor, "bitwise_or"),
                   (aten.bitwise_xor.Tensor, "bitwise_xor"),
                   (aten.pow.Tensor_Tensor, "pow"), (aten.pow.Tensor_Scalar, "pow")]:
    register(_op, table="prims")(_binary_rule(_prim))


@register(aten.pow.Scalar, table="prims")
def pow_scalar(self, exponent):
    a, b = operands(self, exponent)
    return P.pow(a, b)


def _compare_rule(prim_name: str):
    prim = getattr(P, prim_name)

    def rule(self, other):
        a, b = operands(self, other)
        return prim(a, b)
    return rule


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ov in ("Tensor", "Scalar"):
        register(getattr(getattr(aten, _name), _ov), table="prims")(_compare_rule(_name))


@register(aten.div.Tensor, aten.div.Scalar, table="prims")
def div(self, other):
    dt = _float_dtype(torch.result_type(self, other))
    a, b = operands(self, other, dtype=dt)
    return P.div(a, b)


@register(aten.div.Tensor_mode, table="prims")
def div_mode(self, other, *, rounding_mode=None):
    dt = torch.result_type(self, other)
    if rounding_mode is None:
        return div(self, other)
    a, b = operands(self, other, dtype=dt)
    if dt.is_floating_point:
        q = P.div(a, b)
        return P.trunc(q) if rounding_mode == "trunc" else P.floor(q)
    q = P.div(a, b)  # C truncation for integers
    if rounding_mode == "trunc":
        return q
    zero = broadcast_to(P.full([], 0, dtype=dt, device=q.device), q.shape)
    inexact = P.ne(P.fmod(a, b), zero)
    signs_differ = P.ne(P.lt(a, zero), P.lt(b, zero))
    one = broadcast_to(P.full([], 1, dtype=dt, device=q.device), q.shape)
    return P.where(P.bitwise_and(inexact, signs_differ), P.sub(q, one), q)


@register(aten.logical_not.default, table="prims")
def logical_not(self):
    a, z = operands(self, 0, dtype=self.dtype)
    return P.eq(a, z)


def _as_bool(x):
    if x.dtype == torch.bool:
        return x
    a, z = operands(x, 0, dtype=x.dtype)
    return P.ne(a, z)


def _logical_rule(prim_name: str):
    prim = getattr(P, prim_name)

    def rule(self, other):
        a, b = operands(_as_bool(self), _as_bool(other), dtype=torch.bool)
        return prim(a, b)
    return rule


for _op, _prim in [(aten.logical_and.default, "bitwise_and"), (aten.logical_or.default, "bitwise_or"),
                   (aten.logical_xor.default, "bitwise_xor")]:
    register(_op, table="prims")(_logical_rule(_prim))


@register(aten.bitwise_not.default, table="prims")
def bitwise_not(self):
    return P.bitwise_not(self)


@register(aten.isnan.default, table="prims")
def isnan(self):
    return P.ne(self, self)


@register(aten.isinf.default, table="prims")
def isinf(self):
    if not self.dtype.is_floating_point:
        return P.full(list(self.shape), False, dtype=torch.bool, device=self.device)
    a, inf = operands(P.abs(self), math.inf, dtype=self.dtype)
    return P.eq(a, inf)


@register(aten.where.self, table="prims")
def where(condition, self, other):
    dt = torch.result_type(self, other)
    shape = broadcast_shape(_shape_of(condition), _shape_of(self), _shape_of(other))
    a, b = (broadcast_to(to_dtype(t, dt), shape) for t in (self, other))
    return P.where(broadcast_to(condition, shape), a, b)


@register(aten.clamp.default, aten.clamp.Tensor, table="prims")
def clamp(self, min=None, max=None):
    out = self
    dt = self.dtype
    for bound, prim in ((min, P.maximum), (max, P.minimum)):
        if bound is None:
            continue
        dt = torch.result_type(out, bound)
        a, b = operands(out, bound, dtype=dt)
        out = prim(a, b)
    return out if out is not self else P.clone(self)


# -- reductions ------------------------------------------------------------------------------------
def _keep(out, x, dims, keepdim):
    if not keepdim:
        return out
    shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
    return P.reshape(out, shape)


def _reduce(prim, x, dim, keepdim):
    dims = reduction_dims(dim, x.dim()) if x.dim() else []
    return _keep(prim(x, dims), x, dims, keepdim)


def _acc_dtype(x, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if not (x.dtype.is_floating_point or x.dtype.is_complex) else x.dtype


@register(aten.sum.dim_IntList, table="prims")
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce(P.sum, to_dtype(self, _acc_dtype(self, dtype)), dim, keepdim)


@register(aten.sum.default, table="prims")
def sum_all(self, *, dtype=None):
    return sum_dim(self, None, False, dtype=dtype)


@register(aten.prod.default, table="prims")
def prod_all(self, *, dtype=None):
    return _reduce(P.prod, to_dtype(self, _acc_dtype(self, dtype)), None, False)


@register(aten.prod.dim_int, table="prims")
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce(P.prod, to_dtype(self, _acc_dtype(self, dtype)), [dim], keepdim)


@register(aten.amax.default, table="prims")
def amax(self, dim=(), keepdim=False):
    return _reduce(P.amax, self, list(dim), keepdim)


@register(aten.amin.default, table="prims")
def amin(self, dim=(), keepdim=False):
    return _reduce(P.amin, self, list(dim), keepdim)


@register(aten.mean.dim, table="prims")
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    x = to_dtype(self, dtype) if dtype is not None else self
    dims = reduction_dims(dim, x.dim()) if x.dim() else []
    n = 1
    for d in dims:
        n = n * x.shape[d]
    s = _keep(P.sum(x, dims), x, dims, keepdim)
    a, b = operands(s, n, dtype=x.dtype)
    return P.div(a, b)


@register(aten.var.correction, table="prims")
def var(self, dim=None, *, correction=None, keepdim=False):
    x = self
    dims = reduction_dims(dim, x.dim()) if x.dim() else []
    n = 1
    for d in dims:
        n = n * x.shape[d]
    mean = mean_dim(x, dims, True)
    diff = P.sub(x, broadcast_to(mean, x.shape))
    ss = _keep(P.sum(P.mul(diff, diff), dims), x, dims, keepdim)
    c = 1 if correction is None else correction
    a, b = operands(ss, max(n - c, 0), dtype=x.dtype)
    return P.div(a, b)


@register(aten.any.default, table="prims")
def any_all(self):
    return any_dim(self, None, False)


@register(aten.any.dim, table="prims")
def any_dim(self, dim=None, keepdim=False):
    s = _reduce(P.sum, P.convert_element_type(_as_bool(self), torch.int64), None if dim is None else [dim], keepdim)
    a, z = operands(s, 0, dtype=torch.int64)
    return P.gt(a, z)


def _arg(prim, self, dim, keepdim):
    if dim is None:
        flat = P.reshape(self, [-1]) if self.dim() else P.reshape(self, [1])
        out = prim(flat, 0)
        return P.reshape(out, [1] * self.dim()) if keepdim else out
    d = canonical_dim(dim, self.dim())
    if self.dim() == 0:
        return P.full([], 0, dtype=torch.int64, device=self.device)
    return _keep(prim(self, d), self, [d], keepdim)


@register(aten.argmax.default, table="prims")
def argmax(self, dim=None, keepdim=False):
    return _arg(P.argmax, self, dim, keepdim)


@register(aten.argmin.default, table="prims")
def argmin(self, dim=None, keepdim=False):
    return _arg(P.argmin, self, dim, keepdim)


@register(aten.max.dim, table="prims")
def max_dim(self, dim, keepdim=False):
    return amax(self, [dim], keepdim), argmax(self, dim, keepdim)


@register(aten.min.dim, table="prims")
def min_dim(self, dim, keepdim=False):
    return amin(self, [dim], keepdim), argmin(self, dim, keepdim)
