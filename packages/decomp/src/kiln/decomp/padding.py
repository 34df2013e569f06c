"""Reflection and replication padding (1-d and 2-d), forward and backward, as index arithmetic."""

from __future__ import annotations

from .common import arange, aten, zeros
from .registry import Family

FAMILY = Family("padding")
register = FAMILY.register


def _src_index(n, before, after, like, mode):
    """Source position of each output position along one padded dim."""
    i = aten.sub.Tensor(arange(n + before + after, like), before)
    if mode == "replicate":
        return aten.clamp.default(i, 0, n - 1)
    # reflect: -k -> k, n-1+k -> n-1-k
    i = aten.abs.default(i)
    return aten.sub.Tensor(n - 1, aten.abs.default(aten.sub.Tensor(i, n - 1)))


def _indices(self_shape, padding, like, mode):
    """Index tensors for the last len(padding)//2 dims (padding is last-dim-first, like F.pad)."""
    k = len(padding) // 2
    nd = len(self_shape)
    idx = []
    for j in range(k):  # j-th padded dim counting from the first padded one
        d = nd - k + j
        before, after = padding[2 * (k - 1 - j)], padding[2 * (k - 1 - j) + 1]
        src = _src_index(self_shape[d], before, after, like, mode)
        shape = [1] * k
        shape[j] = -1
        idx.append(aten.view.default(src, shape))
    return [None] * (nd - k) + idx


def _pad(self, padding, mode):
    return aten.index.Tensor(self, _indices(list(self.shape), list(padding), self, mode))


def _pad_backward(grad_output, self, padding, mode):
    return aten.index_put.default(zeros(self.shape, grad_output), _indices(list(self.shape), list(padding), self, mode),
                                  grad_output, True)


for _dims in ("1d", "2d", "3d"):
    for _mode, _name in (("reflect", "reflection_pad"), ("replicate", "replication_pad")):
        _fwd = getattr(aten, f"{_name}{_dims}").default
        _bwd = getattr(aten, f"{_name}{_dims}_backward").default
        register(_fwd)(lambda self, padding, _m=_mode: _pad(self, padding, _m))
        register(_bwd)(lambda grad_output, self, padding, _m=_mode: _pad_backward(grad_output, self, padding, _m))
