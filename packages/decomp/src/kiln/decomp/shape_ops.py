"""View and shape ops: t/transpose/reshape/squeeze, split/chunk/unbind/stack, repeat/roll/tril/triu."""

from __future__ import annotations

import torch

from kiln.graph import view_strides

from .common import arange, aten, canonical_dim, contiguous, reshape, where_scalar, zeros
from .registry import Family

FAMILY = Family("shape_ops")
register = FAMILY.register


@register(aten.t.default)
def t(self):
    if self.dim() < 2:
        return aten.alias.default(self)
    return aten.permute.default(self, [1, 0])


@register(aten.transpose.int)
def transpose(self, dim0, dim1):
    n = self.dim()
    if n == 0:
        return aten.alias.default(self)
    perm = list(range(n))
    a, b = canonical_dim(dim0, n), canonical_dim(dim1, n)
    perm[a], perm[b] = perm[b], perm[a]
    return aten.permute.default(self, perm)


@register(aten.numpy_T.default)
def numpy_t(self):
    return aten.permute.default(self, list(reversed(range(self.dim()))))


@register(aten._unsafe_view.default, aten._reshape_alias.default)
def unsafe_view(self, size, stride=None):
    return aten.view.default(self, list(size))


@register(aten.reshape.default)
def reshape_op(self, shape):
    return reshape(self, _infer_shape(shape, self.numel()))


def _infer_shape(shape, numel):
    shape = list(shape)
    if -1 in shape:
        i = shape.index(-1)
        known = 1
        for j, s in enumerate(shape):
            if j != i:
                known = known * s
        shape[i] = numel // known if known != 0 else 0
    return shape


@register(aten.view_copy.default)
def view_copy(self, size):
    return aten.clone.default(reshape(self, size))


@register(aten.squeeze.default)
def squeeze(self):
    return aten.squeeze.dims(self, [d for d, s in enumerate(self.shape) if s == 1])


@register(aten.squeeze.dim)
def squeeze_dim(self, dim):
    return aten.squeeze.dims(self, [dim])


@register(aten.expand_copy.default)
def expand_copy(self, size, *, implicit=False):
    return aten.clone.default(aten.expand.default(self, size))


@register(aten.permute_copy.default)
def permute_copy(self, dims):
    return aten.clone.default(aten.permute.default(self, dims))


@register(aten.split.Tensor)
def split(self, split_size, dim=0):
    d = canonical_dim(dim, self.dim())
    n = self.shape[d]
    if split_size == 0:
        return [aten.slice.Tensor(self, d, 0, n)]
    sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    return split_with_sizes(self, sizes or [0], d)


@register(aten.split_with_sizes.default)
def split_with_sizes(self, split_sizes, dim=0):
    d = canonical_dim(dim, self.dim())
    out, start = [], 0
    for s in split_sizes:
        out.append(aten.slice.Tensor(self, d, start, start + s))
        start = start + s
    return out


@register(aten.unbind.int)
def unbind(self, dim=0):
    d = canonical_dim(dim, self.dim())
    return [aten.select.int(self, d, i) for i in range(self.shape[d])]


@register(aten.stack.default)
def stack(tensors, dim=0):
    d = canonical_dim(dim, tensors[0].dim() + 1)
    return aten.cat.default([aten.unsqueeze.default(x, d) for x in tensors], d)


@register(aten.narrow.default)
def narrow(self, dim, start, length):
    d = canonical_dim(dim, self.dim())
    if start < 0:
        start = start + self.shape[d]
    return aten.slice.Tensor(self, d, start, start + length)


@register(aten.repeat.default)
def repeat(self, repeats):
    repeats = list(repeats)
    lead = len(repeats) - self.dim()
    shape = [1] * lead + list(self.shape)
    x = aten.view.default(contiguous(self), shape)
    inter, expanded, final = [], [], []
    for r, s in zip(repeats, shape):
        inter += [1, s]
        expanded += [r, s]
        final.append(r * s)
    x = aten.expand.default(aten.view.default(x, inter), expanded)
    return aten.view.default(aten.clone.default(x, memory_format=torch.contiguous_format), final)


@register(aten.roll.default)
def roll(self, shifts, dims=()):
    shifts, dims = list(shifts), list(dims)
    if not dims:
        flat = reshape(self, [-1] if self.numel() else [0])
        return aten.view.default(roll(flat, shifts, [0]), list(self.shape))
    x = self
    for s, d in zip(shifts, dims):
        d = canonical_dim(d, self.dim())
        n = self.shape[d]
        if n == 0:
            continue
        s = s % n
        if s == 0:
            continue
        x = aten.cat.default([aten.slice.Tensor(x, d, n - s, n), aten.slice.Tensor(x, d, 0, n - s)], d)
    return x if x is not self else aten.clone.default(self)


def _tri_mask(self, diagonal, lower):
    rows, cols = self.shape[-2], self.shape[-1]
    r = aten.unsqueeze.default(arange(rows, self), 1)
    c = aten.unsqueeze.default(arange(cols, self), 0)
    diff = aten.sub.Tensor(c, r)
    return aten.le.Scalar(diff, diagonal) if lower else aten.ge.Scalar(diff, diagonal)


@register(aten.tril.default)
def tril(self, diagonal=0):
    return where_scalar(_tri_mask(self, diagonal, True), self, 0, self)


@register(aten.triu.default)
def triu(self, diagonal=0):
    return where_scalar(_tri_mask(self, diagonal, False), self, 0, self)


@register(aten.select_backward.default)
def select_backward(grad_output, input_sizes, dim, index):
    return aten.select_scatter.default(zeros(input_sizes, grad_output), grad_output, dim, index)


@register(aten.slice_backward.default)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    return aten.slice_scatter.default(zeros(input_sizes, grad_output), grad_output, dim, start, end, step)


@register(aten.unfold.default)
def unfold(self, dimension, size, step):
    d = canonical_dim(dimension, self.dim())
    n = (self.shape[d] - size) // step + 1 if self.dim() else 1
    if self.dim() == 0:
        return aten.view.default(self, [1])
    idx = aten.add.Tensor(aten.unsqueeze.default(aten.mul.Tensor(arange(n, self), step), 1),
                          aten.unsqueeze.default(arange(size, self), 0))
    g = aten.index_select.default(self, d, aten.view.default(idx, [-1]))
    shape = list(self.shape)
    g = aten.view.default(g, shape[:d] + [n, size] + shape[d + 1:])
    perm = list(range(d + 1)) + list(range(d + 2, self.dim() + 1)) + [d + 1]
    return aten.permute.default(g, perm)


@register(aten.diagonal.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    n = self.dim()
    a, b = canonical_dim(dim1, n), canonical_dim(dim2, n)
    size = max(0, min(self.shape[a] + min(offset, 0), self.shape[b] - max(offset, 0)))
    st = self.stride()
    keep = [i for i in range(n) if i not in (a, b)]
    off = self.storage_offset() + (offset * st[b] if offset >= 0 else -offset * st[a])
    return aten.as_strided.default(self, [self.shape[i] for i in keep] + [size],
                                   [st[i] for i in keep] + [st[a] + st[b]], off)


@register(aten.view.default)
def view(self, size):
    # Note: a decomposed producer may lay its result out differently from the eager kernel the
    # graph was traced with (e.g. a layer norm of a permuted input); values are what a functional
    # graph promises, so a view that no longer fits the layout reads a contiguous copy instead.
    shape = _infer_shape(size, self.numel())
    if self.is_contiguous() or view_strides(list(self.shape), list(self.stride()), shape) is not None:
        return NotImplemented
    return aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), shape)


@register(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    if not self.is_contiguous():
        return NotImplemented
    idx = aten.full.default([], storage_offset or 0, dtype=torch.int64, device=self.device)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = aten.add.Tensor(idx, aten.view.default(aten.mul.Tensor(arange(n, self), st), shape))
    flat = aten.view.default(aten.clone.default(self), [-1])
    out = aten.index_put.default(flat, [reshape(idx, [-1])], reshape(src, [-1]), False)
    return aten.view.default(out, list(self.shape))


def _copy_of(view_op):
    def rule(self, *args, **kwargs):
        out = view_op(self, *args, **kwargs)
        if isinstance(out, (list, tuple)):
            return [aten.clone.default(o) for o in out]
        return aten.clone.default(out)
    return rule


# The ``*_copy`` variants functionalized graphs may contain: the view, then a copy.
for _copy, _view in [(aten.t_copy.default, aten.t.default), (aten.transpose_copy.int, aten.transpose.int),
                     (aten.unsqueeze_copy.default, aten.unsqueeze.default),
                     (aten.squeeze_copy.dims, aten.squeeze.dims), (aten.select_copy.int, aten.select.int),
                     (aten.slice_copy.Tensor, aten.slice.Tensor), (aten.detach_copy.default, aten.detach.default),
                     (aten.alias_copy.default, aten.alias.default), (aten.unbind_copy.int, aten.unbind.int),
                     (aten.split_with_sizes_copy.default, aten.split_with_sizes.default),
                     (aten.diagonal_copy.default, aten.diagonal.default), (aten.unfold_copy.default, aten.unfold.default)]:
    register(_copy)(_copy_of(_view))


@register(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = self.shape
    oc = c // (r * r)
    x = aten.view.default(contiguous(self), [*lead, oc, r, r, h, w])
    n = len(lead)
    perm = list(range(n)) + [n, n + 3, n + 1, n + 4, n + 2]
    x = aten.permute.default(x, perm)
    return aten.view.default(aten.clone.default(x, memory_format=torch.contiguous_format), [*lead, oc, h * r, w * r])


@register(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = self.shape
    x = aten.view.default(contiguous(self), [*lead, c, h // r, r, w // r, r])
    n = len(lead)
    perm = list(range(n)) + [n, n + 2, n + 4, n + 1, n + 3]
    x = aten.permute.default(x, perm)
    return aten.view.default(aten.clone.default(x, memory_format=torch.contiguous_format), [*lead, c * r * r, h // r, w // r])
