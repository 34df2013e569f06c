"""Indexing: index_add/copy/fill, _unsafe_index(_put), take_along_dim, embedding and its backward."""

from __future__ import annotations

import torch

from .common import aten, canonical_dim, convert, reshape, scalar_like, where_scalar
from .registry import Family

FAMILY = Family("indexing")
register = FAMILY.register


def _dim_indices(dim, index):
    return [None] * dim + [index]


@register(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    d = canonical_dim(dim, self.dim())
    if self.dim() == 0:
        return aten.add.Tensor(self, aten.mul.Tensor(aten.view.default(source, []), alpha))
    src = source if alpha == 1 else aten.mul.Tensor(source, alpha)
    return aten.index_put.default(self, _dim_indices(d, index), src, True)


@register(aten.index_copy.default)
def index_copy(self, dim, index, source):
    d = canonical_dim(dim, self.dim())
    if self.dim() == 0:
        return aten.clone.default(aten.view.default(source, []))
    return aten.index_put.default(self, _dim_indices(d, index), source, False)


@register(aten.index_fill.int_Scalar)
def index_fill_scalar(self, dim, index, value):
    return index_fill_tensor(self, dim, index, scalar_like(self, value))


@register(aten.index_fill.int_Tensor)
def index_fill_tensor(self, dim, index, value):
    d = canonical_dim(dim, self.dim())
    if self.dim() == 0:
        return aten.clone.default(convert(value, self.dtype))
    return aten.index_put.default(self, _dim_indices(d, aten.view.default(index, [-1])), convert(value, self.dtype), False)


@register(aten._unsafe_index.Tensor)
def unsafe_index(self, indices):
    return aten.index.Tensor(self, indices)


@register(aten._unsafe_index_put.default)
def unsafe_index_put(self, indices, values, accumulate=False):
    return aten.index_put.default(self, indices, values, accumulate)


@register(aten.take_along_dim.default)
def take_along_dim(self, indices, dim=None):
    if dim is None:
        return aten.gather.default(reshape(self, [-1]), 0, reshape(indices, [-1]))
    d = canonical_dim(dim, self.dim())
    shape = [max(a, b) for a, b in zip(self.shape, indices.shape)]
    sshape, ishape = list(shape), list(shape)
    sshape[d], ishape[d] = self.shape[d], indices.shape[d]
    return aten.gather.default(aten.expand.default(self, sshape), d, aten.expand.default(indices, ishape))


@register(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if indices.dim() == 1:
        return aten.index_select.default(weight, 0, indices)
    flat = aten.index_select.default(weight, 0, reshape(indices, [-1]))
    return aten.view.default(flat, list(indices.shape) + [weight.shape[1]])


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad_output.shape[-1]
    idx = reshape(indices, [-1])
    g = reshape(grad_output, [-1, dim])
    if padding_idx >= 0:
        keep = aten.unsqueeze.default(aten.ne.Scalar(idx, padding_idx), 1)
        g = where_scalar(keep, g, 0, g)
    if scale_grad_by_freq:
        ones = aten.full.default([idx.shape[0]], 1, dtype=g.dtype, device=g.device)
        counts = aten.index_put.default(aten.full.default([num_weights], 0, dtype=g.dtype, device=g.device), [idx], ones, True)
        g = aten.div.Tensor(g, aten.unsqueeze.default(aten.index_select.default(counts, 0, idx), 1))
    zeros = aten.full.default([num_weights, dim], 0, dtype=g.dtype, device=g.device)
    return aten.index_put.default(zeros, [idx], g, True)


@register(aten.scatter.reduce)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    mode = {"add": "sum", "multiply": "prod"}[reduce]
    return aten.scatter_reduce.two(self, dim, index, src, mode, include_self=True)


@register(aten.scatter.value_reduce)
def scatter_value_reduce(self, dim, index, value, *, reduce):
    src = aten.full.default(list(index.shape), value, dtype=self.dtype, device=self.device)
    return scatter_reduce_legacy(self, dim, index, src, reduce=reduce)


@register(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    n = self.dim()
    a, b = canonical_dim(dim1, n), canonical_dim(dim2, n)
    size = src.shape[-1]
    r = aten.arange.start_step(0, size, 1, dtype=torch.int64, device=self.device)
    ra = aten.add.Scalar(r, max(-offset, 0))
    rb = aten.add.Scalar(r, max(offset, 0))
    perm = [i for i in range(n) if i not in (a, b)] + [a, b]
    moved = aten.permute.default(self, perm)
    lead = [None] * (n - 2)
    out = aten.index_put.default(moved, lead + [ra, rb], src, False)
    inv = [perm.index(i) for i in range(n)]
    return aten.clone.default(aten.permute.default(out, inv), memory_format=torch.contiguous_format)
