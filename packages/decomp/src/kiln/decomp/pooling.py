"""Pooling: adaptive average/max pooling (forward and backward), max_pool2d, avg_pool1d.

Note: adaptive average pooling is linear and separable, so it is written as two small matrix
products with pooling matrices ``P[i, j] = [start_i <= j < end_i] / (end_i - start_i)`` built from
``arange`` comparisons: exact for every input/output size, and its backward is the transposed
products. Global pooling (output 1x1) is a plain mean.
"""

from __future__ import annotations

import torch

from .common import arange, aten, convert, reshape
from .registry import Family

FAMILY = Family("pooling")
register = FAMILY.register


def _pool_matrix(n_in, n_out, like):
    """(n_out, n_in) averaging matrix of adaptive pooling, in ``like``'s dtype."""
    i = arange(n_out, like)
    start = aten.div.Tensor_mode(aten.mul.Tensor(i, n_in), n_out, rounding_mode="floor")
    end = aten.div.Tensor_mode(aten.add.Tensor(aten.mul.Tensor(aten.add.Tensor(i, 1), n_in), n_out - 1), n_out, rounding_mode="floor")
    j = aten.unsqueeze.default(arange(n_in, like), 0)
    inside = aten.logical_and.default(aten.ge.Tensor(j, aten.unsqueeze.default(start, 1)), aten.lt.Tensor(j, aten.unsqueeze.default(end, 1)))
    count = convert(aten.unsqueeze.default(aten.sub.Tensor(end, start), 1), like.dtype)
    return aten.div.Tensor(convert(inside, like.dtype), count)


def _apply_last(x, m):
    """x[..., k] -> x[..., k] @ m.T for a (n_out, n_in) matrix ``m``."""
    lead = list(x.shape[:-1])
    out = aten.mm.default(reshape(x, [-1, x.shape[-1]]), aten.permute.default(m, [1, 0]))
    return aten.view.default(out, lead + [m.shape[0]])


def _swap_last2(x):
    perm = list(range(x.dim()))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return aten.permute.default(x, perm)


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    oh, ow = output_size
    h, w = self.shape[-2], self.shape[-1]
    if oh == 1 and ow == 1:
        return aten.mean.dim(self, [-2, -1], True)
    x = _apply_last(self, _pool_matrix(w, ow, self))
    x = _apply_last(_swap_last2(x), _pool_matrix(h, oh, self))
    return aten.clone.default(_swap_last2(x), memory_format=torch.contiguous_format)


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    oh, ow = grad_output.shape[-2], grad_output.shape[-1]
    h, w = self.shape[-2], self.shape[-1]
    if oh == 1 and ow == 1:
        return aten.clone.default(aten.expand.default(aten.div.Tensor(grad_output, h * w), list(self.shape)))
    g = _apply_last(grad_output, aten.permute.default(_pool_matrix(w, ow, grad_output), [1, 0]))
    g = _apply_last(_swap_last2(g), aten.permute.default(_pool_matrix(h, oh, grad_output), [1, 0]))
    return aten.clone.default(_swap_last2(g), memory_format=torch.contiguous_format)


@register(aten.max_pool2d.default)
def max_pool2d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return aten.max_pool2d_with_indices.default(self, kernel_size, stride, padding, dilation, ceil_mode)[0]


@register(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    oh, ow = output_size
    h, w = self.shape[-2], self.shape[-1]
    if oh == 0 or ow == 0 or h % oh or w % ow:
        return NotImplemented  # uneven windows: left to the backend as aten.adaptive_max_pool2d
    k = [h // oh, w // ow]
    return aten.max_pool2d_with_indices.default(self, k, k)


@register(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    h, w = self.shape[-2], self.shape[-1]
    oh, ow = grad_output.shape[-2], grad_output.shape[-1]
    if oh == 0 or ow == 0 or h % oh or w % ow:
        return NotImplemented
    k = [h // oh, w // ow]
    return aten.max_pool2d_with_indices_backward.default(grad_output, self, k, k, [0, 0], [1, 1], False, indices)
