"""Activation functions and their backward ops."""

from __future__ import annotations

import math

from .common import aten, where_scalar
from .registry import Family

FAMILY = Family("activations")
register = FAMILY.register

_SQRT1_2 = 1 / math.sqrt(2)
_SQRT2_PI = math.sqrt(2 / math.pi)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


@register(aten.relu.default)
def relu(self):
    return aten.clamp.default(self, 0)


@register(aten.threshold.default)
def threshold(self, threshold, value):
    return where_scalar(aten.le.Scalar(self, threshold), value, self, self)


@register(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return where_scalar(aten.le.Scalar(self, threshold), 0, grad_output, grad_output)


@register(aten.gelu.default)
def gelu(self, *, approximate="none"):
    if approximate == "tanh":
        inner = aten.mul.Tensor(aten.add.Tensor(self, aten.mul.Tensor(aten.pow.Tensor_Scalar(self, 3), 0.044715)), _SQRT2_PI)
        return aten.mul.Tensor(aten.mul.Tensor(self, 0.5), aten.add.Tensor(aten.tanh.default(inner), 1))
    cdf = aten.add.Tensor(aten.erf.default(aten.mul.Tensor(self, _SQRT1_2)), 1)
    return aten.mul.Tensor(aten.mul.Tensor(self, 0.5), cdf)


@register(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    x = self
    if approximate == "tanh":
        x2 = aten.mul.Tensor(x, x)
        inner = aten.mul.Tensor(aten.add.Tensor(x, aten.mul.Tensor(aten.mul.Tensor(x2, x), 0.044715)), _SQRT2_PI)
        t = aten.tanh.default(inner)
        left = aten.mul.Tensor(aten.add.Tensor(t, 1), 0.5)
        d_inner = aten.mul.Tensor(aten.add.Tensor(aten.mul.Tensor(x2, 3 * 0.044715), 1), _SQRT2_PI)
        one_minus_t2 = aten.rsub.Scalar(aten.mul.Tensor(t, t), 1)
        right = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(x, 0.5), one_minus_t2), d_inner)
        return aten.mul.Tensor(grad_output, aten.add.Tensor(left, right))
    cdf = aten.mul.Tensor(aten.add.Tensor(aten.erf.default(aten.mul.Tensor(x, _SQRT1_2)), 1), 0.5)
    pdf = aten.mul.Tensor(aten.exp.default(aten.mul.Tensor(aten.mul.Tensor(x, x), -0.5)), _INV_SQRT_2PI)
    return aten.mul.Tensor(grad_output, aten.add.Tensor(cdf, aten.mul.Tensor(x, pdf)))


@register(aten.silu.default)
def silu(self):
    return aten.mul.Tensor(self, aten.sigmoid.default(self))


@register(aten.silu_backward.default)
def silu_backward(grad_output, self):
    s = aten.sigmoid.default(self)
    return aten.mul.Tensor(grad_output, aten.mul.Tensor(s, aten.add.Tensor(aten.mul.Tensor(self, aten.rsub.Scalar(s, 1)), 1)))


def _softplus(x, beta=1, threshold=20):
    xb = aten.mul.Tensor(x, beta) if beta != 1 else x
    soft = aten.log1p.default(aten.exp.default(xb))
    if beta != 1:
        soft = aten.div.Tensor(soft, beta)
    return aten.where.self(aten.gt.Scalar(xb, threshold), x, soft)


@register(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    return _softplus(self, beta, threshold)


@register(aten.softplus_backward.default)
def softplus_backward(grad_output, self, beta, threshold):
    xb = aten.mul.Tensor(self, beta)
    z = aten.exp.default(xb)
    return aten.where.self(aten.gt.Scalar(xb, threshold), grad_output,
                           aten.mul.Tensor(grad_output, aten.div.Tensor(z, aten.add.Tensor(z, 1))))


@register(aten.mish.default)
def mish(self):
    return aten.mul.Tensor(self, aten.tanh.default(_softplus(self)))


@register(aten.mish_backward.default)
def mish_backward(grad_output, self):
    t = aten.tanh.default(_softplus(self))
    s = aten.sigmoid.default(self)
    d = aten.add.Tensor(t, aten.mul.Tensor(aten.mul.Tensor(self, s), aten.rsub.Scalar(aten.mul.Tensor(t, t), 1)))
    return aten.mul.Tensor(grad_output, d)


def _relu6_of_shift(x):
    return aten.clamp.default(aten.add.Tensor(x, 3), 0, 6)


@register(aten.hardswish.default)
def hardswish(self):
    return aten.div.Tensor(aten.mul.Tensor(self, _relu6_of_shift(self)), 6)


@register(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    mid = aten.mul.Tensor(grad_output, aten.add.Tensor(aten.div.Tensor(self, 3), 0.5))
    inner = aten.where.self(aten.le.Scalar(self, 3), mid, grad_output)
    return where_scalar(aten.lt.Scalar(self, -3), 0, inner, grad_output)


@register(aten.hardsigmoid.default)
def hardsigmoid(self):
    return aten.div.Tensor(_relu6_of_shift(self), 6)


@register(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    inside = aten.logical_and.default(aten.gt.Scalar(self, -3), aten.lt.Scalar(self, 3))
    return where_scalar(inside, aten.div.Tensor(grad_output, 6), 0, grad_output)


@register(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    return aten.clamp.default(self, min_val, max_val)


@register(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, self, min_val, max_val):
    outside = aten.logical_or.default(aten.le.Scalar(self, min_val), aten.ge.Scalar(self, max_val))
    return where_scalar(outside, 0, grad_output, grad_output)


@register(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    neg = aten.mul.Tensor(aten.expm1.default(aten.mul.Tensor(self, input_scale)), alpha * scale)
    return aten.where.self(aten.le.Scalar(self, 0), neg, aten.mul.Tensor(self, scale))


@register(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    x = self_or_result
    if is_result:
        neg = aten.mul.Tensor(aten.mul.Tensor(grad_output, input_scale), aten.add.Tensor(x, alpha * scale))
    else:
        e = aten.exp.default(aten.mul.Tensor(x, input_scale))
        neg = aten.mul.Tensor(aten.mul.Tensor(grad_output, input_scale * alpha * scale), e)
    return aten.where.self(aten.le.Scalar(x, 0), neg, aten.mul.Tensor(grad_output, scale))


@register(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    return aten.where.self(aten.gt.Scalar(self, 0), self, aten.mul.Tensor(self, negative_slope))


@register(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return aten.where.self(aten.gt.Scalar(self, 0), grad_output, aten.mul.Tensor(grad_output, negative_slope))


@register(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    return aten.mul.Tensor(grad_output, aten.mul.Tensor(aten.rsub.Scalar(output, 1), output))


@register(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    return aten.mul.Tensor(grad_output, aten.rsub.Scalar(aten.mul.Tensor(output, output), 1))


@register(aten._prelu_kernel.default)
def prelu_kernel(self, weight):
    return aten.where.self(aten.gt.Scalar(self, 0), self, aten.mul.Tensor(weight, self))


@register(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, self, weight):
    pos = aten.gt.Scalar(self, 0)
    gx = aten.where.self(pos, grad_output, aten.mul.Tensor(weight, grad_output))
    gw = where_scalar(pos, 0, aten.mul.Tensor(self, grad_output), grad_output)
    return gx, gw


@register(aten.glu.default)
def glu(self, dim=-1):
    n = self.shape[dim] // 2
    a = aten.slice.Tensor(self, dim, 0, n)
    b = aten.slice.Tensor(self, dim, n, 2 * n)
    return aten.mul.Tensor(a, aten.sigmoid.default(b))


@register(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    z = aten.exp.default(aten.neg.default(aten.abs.default(self)))
    out = aten.sub.Tensor(aten.clamp.default(self, None, 0), aten.log1p.default(z))
    if self.device.type == "cpu":  # the CPU kernel returns exp(-|x|) as its buffer, CUDA an empty one
        return out, z
    return out, aten.full.default([0], 0, dtype=self.dtype, device=self.device)


@register(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    neg = aten.lt.Scalar(self, 0)
    max_deriv = where_scalar(neg, 1, 0, self)
    sign = where_scalar(neg, 1, -1, self)
    z = aten.exp.default(aten.neg.default(aten.abs.default(self)))
    return aten.mul.Tensor(grad_output, aten.sub.Tensor(max_deriv, aten.mul.Tensor(sign, aten.div.Tensor(z, aten.add.Tensor(z, 1)))))


@register(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    keep = aten.gt.Scalar(aten.abs.default(self), lambd)
    return where_scalar(keep, self, 0, self)


@register(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    keep = aten.gt.Scalar(aten.abs.default(self), lambd)
    return where_scalar(keep, grad_out, 0, grad_out)


@register(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    shrunk = aten.sub.Tensor(self, aten.mul.Tensor(aten.sign.default(self), lambd))
    return where_scalar(aten.gt.Scalar(aten.abs.default(self), lambd), shrunk, 0, self)


@register(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return where_scalar(aten.gt.Scalar(aten.abs.default(self), lambd), grad_output, 0, grad_output)


@register(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    n = self.shape[dim] // 2
    a = aten.slice.Tensor(self, dim, 0, n)
    s = aten.sigmoid.default(aten.slice.Tensor(self, dim, n, 2 * n))
    grad_a = aten.mul.Tensor(grad_output, s)
    grad_b = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_output, a), s), aten.rsub.Scalar(s, 1))
    return aten.cat.default([grad_a, grad_b], dim)
