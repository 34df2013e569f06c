"""Reductions outside the core set: mean/var/std variants, logsumexp, norms, all, max/min overloads."""

from __future__ import annotations

import torch

from .common import aten, convert, numel_of, reduction_dims, where_scalar
from .registry import Family

FAMILY = Family("reductions")
register = FAMILY.register


@register(aten.mean.default)
def mean(self, *, dtype=None):
    return aten.mean.dim(self, list(range(self.dim())), False, dtype=dtype)


@register(aten.var.default)
def var_default(self, unbiased=True):
    return aten.var.correction(self, None, correction=1 if unbiased else 0)


@register(aten.var.dim)
def var_dim(self, dim, unbiased=True, keepdim=False):
    return aten.var.correction(self, dim, correction=1 if unbiased else 0, keepdim=keepdim)


@register(aten.std.correction)
def std_correction(self, dim=None, *, correction=None, keepdim=False):
    return aten.sqrt.default(aten.var.correction(self, dim, correction=correction, keepdim=keepdim))


@register(aten.std.default)
def std_default(self, unbiased=True):
    return std_correction(self, None, correction=1 if unbiased else 0)


@register(aten.std.dim)
def std_dim(self, dim, unbiased=True, keepdim=False):
    return std_correction(self, dim, correction=1 if unbiased else 0, keepdim=keepdim)


@register(aten.var_mean.correction)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    dims = reduction_dims(dim, self.dim())
    return (aten.var.correction(self, dims, correction=correction, keepdim=keepdim),
            aten.mean.dim(self, dims, keepdim))


@register(aten.std_mean.correction)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m = var_mean(self, dim, correction=correction, keepdim=keepdim)
    return aten.sqrt.default(v), m


@register(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    x = self if self.dtype.is_floating_point else convert(self, torch.get_default_dtype())
    dims = reduction_dims(dim, x.dim())
    if x.dim() == 0:
        return aten.clone.default(x)
    m = aten.amax.default(x, dims, True)
    m = where_scalar(aten.isinf.default(m), 0, m, m)
    s = aten.sum.dim_IntList(aten.exp.default(aten.sub.Tensor(x, m)), dims, True)
    out = aten.add.Tensor(aten.log.default(s), m)
    return out if keepdim else aten.squeeze.dims(out, dims)


@register(aten.linalg_vector_norm.default)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = convert(self, dtype) if dtype is not None else self
    dims = reduction_dims(dim, x.dim())
    if x.dim() == 0:
        dims = []
    ax = aten.abs.default(x)
    if ord == float("inf"):
        return aten.amax.default(ax, dims, keepdim)
    if ord == float("-inf"):
        return aten.amin.default(ax, dims, keepdim)
    if ord == 0:
        return aten.sum.dim_IntList(convert(aten.ne.Scalar(x, 0), x.dtype), dims, keepdim)
    if ord == 1:
        return aten.sum.dim_IntList(ax, dims, keepdim)
    if ord == 2:
        return aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(x, x), dims, keepdim))
    return aten.pow.Tensor_Scalar(aten.sum.dim_IntList(aten.pow.Tensor_Scalar(ax, ord), dims, keepdim), 1.0 / ord)


@register(aten.norm.Scalar)
def norm_scalar(self, p=2):
    return linalg_vector_norm(self, 2 if p is None else p)


@register(aten.norm.ScalarOpt_dim)
def norm_dim(self, p, dim, keepdim=False):
    return linalg_vector_norm(self, 2 if p is None else p, dim, keepdim)


@register(aten.all.default)
def all_default(self):
    return aten.logical_not.default(aten.any.default(aten.logical_not.default(self)))


@register(aten.all.dim)
def all_dim(self, dim, keepdim=False):
    return aten.logical_not.default(aten.any.dim(aten.logical_not.default(self), dim, keepdim))


@register(aten.any.dims)
def any_dims(self, dim=None, keepdim=False):
    out = aten.ne.Scalar(self, 0) if self.dtype != torch.bool else self
    dims = reduction_dims(dim, self.dim())
    if self.dim() == 0:
        return aten.clone.default(out)
    out = convert(out, torch.int64)
    return aten.gt.Scalar(aten.sum.dim_IntList(out, dims, keepdim), 0)


@register(aten.max.default)
def max_default(self):
    return aten.amax.default(self, [])


@register(aten.min.default)
def min_default(self):
    return aten.amin.default(self, [])


@register(aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim):
    return aten.sum.dim_IntList(convert(aten.ne.Scalar(self, 0), torch.int64), list(dim))


@register(aten.count_nonzero.default)
def count_nonzero_default(self, dim=None):
    dims = [] if dim is None else [dim]
    return aten.sum.dim_IntList(convert(aten.ne.Scalar(self, 0), torch.int64), dims)


@register(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    x = where_scalar(aten.isnan.default(self), 0, self, self)
    return aten.sum.dim_IntList(x, reduction_dims(dim, self.dim()) if self.dim() else [], keepdim, dtype=dtype)


@register(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    dims = [] if dim is None else [dim]
    return aten.amin.default(self, dims, keepdim), aten.amax.default(self, dims, keepdim)


def mean_of(x, dims, keepdim=True):
    """Mean over ``dims`` as sum / count (the core-friendly form used by the norms)."""
    return aten.div.Tensor(aten.sum.dim_IntList(x, dims, keepdim), numel_of(x, dims))
