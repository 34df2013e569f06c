"""Pointwise ops outside the core set: rsub, addcmul, lerp, clamp_min, masked_fill, where overloads..."""

from __future__ import annotations

import torch

from .common import aten, convert, scalar_like, where_scalar
from .registry import Family

FAMILY = Family("elementwise")
register = FAMILY.register


@register(aten.rsub.Tensor)
def rsub_tensor(self, other, alpha=1):
    return aten.sub.Tensor(other, self, alpha=alpha)


@register(aten.rsub.Scalar)
def rsub_scalar(self, other, alpha=1):
    scaled = self if alpha == 1 else aten.mul.Tensor(self, alpha)
    return aten.add.Tensor(aten.neg.default(scaled), other)


@register(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    prod = aten.mul.Tensor(tensor1, tensor2)
    return aten.add.Tensor(self, prod if value == 1 else aten.mul.Tensor(prod, value))


@register(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    quot = aten.div.Tensor(tensor1, tensor2)
    return aten.add.Tensor(self, quot if value == 1 else aten.mul.Tensor(quot, value))


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    return aten.add.Tensor(self, aten.mul.Tensor(aten.sub.Tensor(end, self), weight))


@register(aten.clamp_min.default)
def clamp_min(self, min):
    return aten.clamp.default(self, min)


@register(aten.clamp_max.default)
def clamp_max(self, max):
    return aten.clamp.default(self, None, max)


@register(aten.clamp_min.Tensor)
def clamp_min_tensor(self, min):
    return aten.clamp.Tensor(self, min)


@register(aten.clamp_max.Tensor)
def clamp_max_tensor(self, max):
    return aten.clamp.Tensor(self, None, max)


@register(aten.masked_fill.Scalar)
def masked_fill_scalar(self, mask, value):
    return aten.where.self(mask, scalar_like(self, value), self)


@register(aten.masked_fill.Tensor)
def masked_fill_tensor(self, mask, value):
    return aten.where.self(mask, convert(value, self.dtype), self)


@register(aten.where.ScalarSelf)
def where_scalar_self(condition, self, other):
    return aten.where.self(condition, scalar_like(other, self), other)


@register(aten.where.ScalarOther)
def where_scalar_other(condition, self, other):
    return aten.where.self(condition, self, scalar_like(self, other))


@register(aten.floor_divide.default)
def floor_divide(self, other):
    return aten.div.Tensor_mode(self, other, rounding_mode="floor")


@register(aten.floor_divide.Scalar)
def floor_divide_scalar(self, other):
    return aten.div.Tensor_mode(self, other, rounding_mode="floor")


@register(aten.div.Scalar_mode)
def div_scalar_mode(self, other, *, rounding_mode=None):
    return aten.div.Tensor_mode(self, scalar_like(self, other), rounding_mode=rounding_mode)


@register(aten.frac.default)
def frac(self):
    return aten.sub.Tensor(self, aten.trunc.default(self))


@register(aten.exp2.default)
def exp2(self):
    return aten.pow.Scalar(2, self)


@register(aten.square.default)
def square(self):
    return aten.mul.Tensor(self, self)


@register(aten.xlogy.Tensor)
def xlogy(self, other):
    out = aten.mul.Tensor(self, aten.log.default(other))
    zero_x = aten.logical_and.default(aten.eq.Scalar(self, 0), aten.logical_not.default(aten.isnan.default(other)))
    return where_scalar(zero_x, 0, out, out)


@register(aten.logaddexp.default)
def logaddexp(self, other):
    m = aten.maximum.default(self, other)
    d = aten.neg.default(aten.abs.default(aten.sub.Tensor(self, other)))
    both_inf = aten.logical_and.default(aten.isinf.default(self), aten.eq.Tensor(self, other))
    return aten.where.self(both_inf, self, aten.add.Tensor(m, aten.log1p.default(aten.exp.default(d))))


@register(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not self.dtype.is_floating_point:
        return aten.clone.default(self)
    info = torch.finfo(self.dtype)
    out = where_scalar(aten.isnan.default(self), 0.0 if nan is None else nan, self, self)
    out = where_scalar(aten.eq.Scalar(self, float("inf")), info.max if posinf is None else posinf, out, self)
    return where_scalar(aten.eq.Scalar(self, float("-inf")), info.min if neginf is None else neginf, out, self)


@register(aten.sgn.default)
def sgn(self):
    return aten.sign.default(self)


@register(aten.erfc.default)
def erfc(self):
    return aten.rsub.Scalar(aten.erf.default(self), 1)


@register(aten.logit.default)
def logit(self, eps=None):
    x = self if eps is None else aten.clamp.default(self, eps, 1 - eps)
    return aten.log.default(aten.div.Tensor(x, aten.rsub.Scalar(x, 1)))


@register(aten.isposinf.default)
def isposinf(self):
    return aten.eq.Scalar(self, float("inf"))


@register(aten.isneginf.default)
def isneginf(self):
    return aten.eq.Scalar(self, float("-inf"))


@register(aten.signbit.default)
def signbit(self):
    # -0.0 has its sign bit set: 1/-0.0 == -inf
    neg = aten.lt.Scalar(self, 0)
    if not self.dtype.is_floating_point:
        return neg
    negzero = aten.logical_and.default(aten.eq.Scalar(self, 0), aten.lt.Scalar(aten.reciprocal.default(self), 0))
    return aten.logical_or.default(neg, negzero)


@register(aten.bitwise_and.Scalar)
def bitwise_and_scalar(self, other):
    return aten.bitwise_and.Tensor(self, scalar_like(self, other))


@register(aten.bitwise_or.Scalar)
def bitwise_or_scalar(self, other):
    return aten.bitwise_or.Tensor(self, scalar_like(self, other))


@register(aten.bitwise_xor.Scalar)
def bitwise_xor_scalar(self, other):
    return aten.bitwise_xor.Tensor(self, scalar_like(self, other))


@register(aten.deg2rad.default)
def deg2rad(self):
    return aten.mul.Tensor(self, 3.141592653589793 / 180)


@register(aten.rad2deg.default)
def rad2deg(self):
    return aten.mul.Tensor(self, 180 / 3.141592653589793)


@register(aten.hypot.default)
def hypot(self, other):
    return aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(self, self), aten.mul.Tensor(other, other)))


@register(aten.copysign.Tensor)
def copysign(self, other):
    mag = aten.abs.default(self)
    return aten.where.self(signbit(other), aten.neg.default(mag), mag)


@register(aten.fmax.default)
def fmax(self, other):
    return aten.where.self(aten.isnan.default(other), self,
                           aten.where.self(aten.isnan.default(self), other, aten.maximum.default(self, other)))


@register(aten.fmin.default)
def fmin(self, other):
    return aten.where.self(aten.isnan.default(other), self,
                           aten.where.self(aten.isnan.default(self), other, aten.minimum.default(self, other)))


@register(aten.heaviside.default)
def heaviside(self, values):
    zero = aten.eq.Scalar(self, 0)
    pos = convert(aten.gt.Scalar(self, 0), self.dtype)
    return aten.where.self(zero, values, pos)


@register(aten.sinc.default)
def sinc(self):
    x = aten.mul.Tensor(self, 3.141592653589793)
    return where_scalar(aten.eq.Scalar(self, 0), 1, aten.div.Tensor(aten.sin.default(x), x), x)


@register(aten.round.decimals)
def round_decimals(self, *, decimals=0):
    scale = 10.0 ** decimals
    return aten.div.Tensor(aten.round.default(aten.mul.Tensor(self, scale)), scale)
