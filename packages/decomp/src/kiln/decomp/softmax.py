"""Softmax and log-softmax, forward and backward (computed in fp32 for half inputs, like eager)."""

from __future__ import annotations

from .common import aten, canonical_dim, convert, upcast, where_scalar
from .registry import Family

FAMILY = Family("softmax")
register = FAMILY.register


def _shifted(x, dim):
    m = aten.amax.default(x, [dim], True)
    return aten.sub.Tensor(x, m)


@register(aten._softmax.default)
def softmax(self, dim, half_to_float):
    d = canonical_dim(dim, self.dim())
    x = upcast(self)
    if self.dim() == 0:
        return aten.full_like.default(x, 1)
    e = aten.exp.default(_shifted(x, d))
    out = aten.div.Tensor(e, aten.sum.dim_IntList(e, [d], True))
    return out if half_to_float else convert(out, self.dtype)


@register(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    d = canonical_dim(dim, self.dim())
    x = upcast(self)
    if self.dim() == 0:
        return aten.full_like.default(x, 0)
    s = _shifted(x, d)
    out = aten.sub.Tensor(s, aten.log.default(aten.sum.dim_IntList(aten.exp.default(s), [d], True)))
    return out if half_to_float else convert(out, self.dtype)


@register(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    d = canonical_dim(dim, output.dim())
    grad_output, output = upcast(grad_output), upcast(output)
    gy = aten.mul.Tensor(grad_output, output)
    g = aten.sub.Tensor(gy, aten.mul.Tensor(output, aten.sum.dim_IntList(gy, [d], True)))
    return convert(g, input_dtype)


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    d = canonical_dim(dim, output.dim())
    grad_output, output = upcast(grad_output), upcast(output)
    s = aten.sum.dim_IntList(grad_output, [d], True)
    g = aten.sub.Tensor(grad_output, aten.mul.Tensor(aten.exp.default(output), s))
    return convert(g, input_dtype)


@register(aten._safe_softmax.default)
def safe_softmax(self, dim, dtype=None):
    x = convert(self, dtype) if dtype is not None else self
    d = canonical_dim(dim, x.dim())
    out = softmax(x, d, False)
    all_masked = aten.logical_not.default(aten.any.dim(aten.ne.Scalar(x, float("-inf")), d, True))
    return where_scalar(all_masked, 0, out, out)
