"""Core ATen views, copies, factories and extern ops -> kiln_prims."""

from __future__ import annotations

import torch

from .common import aten, canonical_dim
from .prims import EXTERN_OPS
from .registry import Family
from .to_prims import broadcast_to, operands, to_dtype

FAMILY = Family("to_prims_views")
register = FAMILY.register
P = torch.ops.kiln_prims


def _infer(shape, numel):
    shape = list(shape)
    if -1 in shape:
        i = shape.index(-1)
        known = 1
        for j, s in enumerate(shape):
            if j != i:
                known = known * s
        shape[i] = numel // known if known else 0
    return shape


@register(aten.view.default, table="prims")
def view(self, size):
    return P.reshape(self, _infer(size, self.numel()))


@register(aten.permute.default, table="prims")
def permute(self, dims):
    return P.permute(self, [canonical_dim(d, self.dim()) for d in dims])


@register(aten.expand.default, table="prims")
def expand(self, size, *, implicit=False):
    off = len(size) - self.dim()
    shape = [self.shape[i - off] if s == -1 else s for i, s in enumerate(size)]
    out = broadcast_to(self, shape)
    return P.reshape(self, shape) if out is self else out  # a view op must return a new tensor


@register(aten.squeeze.dims, table="prims")
def squeeze(self, dim):
    dims = [canonical_dim(d, self.dim()) for d in dim] if self.dim() else []
    return P.squeeze(self, [d for d in dims if self.shape[d] == 1])


@register(aten.unsqueeze.default, table="prims")
def unsqueeze(self, dim):
    d = canonical_dim(dim, self.dim() + 1)
    shape = list(self.shape)
    shape.insert(d, 1)
    return P.broadcast_in_dim(self, shape, [i for i in range(self.dim() + 1) if i != d])


@register(aten.slice.Tensor, table="prims")
def slice_(self, dim=0, start=None, end=None, step=1):
    d = canonical_dim(dim, self.dim())
    n = self.shape[d]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, 0), n)
    return P.slice(self, d, start, max(end, start), step)


@register(aten.select.int, table="prims")
def select(self, dim, index):
    d = canonical_dim(dim, self.dim())
    i = index + self.shape[d] if index < 0 else index
    return P.squeeze(P.slice(self, d, i, i + 1, 1), [d])


@register(aten.as_strided.default, table="prims")
def as_strided(self, size, stride, storage_offset=None):
    return P.as_strided(self, list(size), list(stride), self.storage_offset() if storage_offset is None else storage_offset)


@register(aten.alias.default, table="prims")
def alias(self):
    return P.reshape(self, list(self.shape))


@register(aten.clone.default, table="prims")
def clone(self, *, memory_format=None):
    return P.clone(self)


@register(aten._to_copy.default, table="prims")
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if device is not None and torch.device(device) != self.device:
        return NotImplemented  # a device copy stays an ATen op (no prim moves data between devices)
    return P.convert_element_type(self, dtype) if dtype is not None and dtype != self.dtype else P.clone(self)


@register(aten.copy.default, table="prims")
def copy(self, src, non_blocking=False):
    return P.clone(broadcast_to(to_dtype(src, self.dtype), list(self.shape)))


def _dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


@register(aten.full.default, table="prims")
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = dtype if dtype is not None else (torch.int64 if isinstance(fill_value, int) and not isinstance(fill_value, bool)
                                           else torch.bool if isinstance(fill_value, bool) else torch.get_default_dtype())
    return P.full(list(size), fill_value, dtype=dt, device=device or torch.device("cpu"))


@register(aten.full_like.default, table="prims")
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return P.full(list(self.shape), fill_value, dtype=dtype or self.dtype, device=device or self.device)


@register(aten.empty.memory_format, table="prims")
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return P.full(list(size), 0, dtype=_dtype(dtype), device=device or torch.device("cpu"))


@register(aten.empty_strided.default, table="prims")
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return P.full(list(size), 0, dtype=_dtype(dtype), device=device or torch.device("cpu"))


@register(aten.scalar_tensor.default, table="prims")
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return P.full([], s, dtype=_dtype(dtype), device=device or torch.device("cpu"))


@register(aten.fill.Scalar, table="prims")
def fill(self, value):
    return P.full(list(self.shape), value, dtype=self.dtype, device=self.device)


@register(aten.arange.start_step, table="prims")
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype()
    length = max(0, -((start - end) // step)) if all(isinstance(v, int) for v in (start, end, step)) else \
        max(0, int(torch.ceil(torch.tensor((end - start) / step)).item()))
    return P.iota(length, start=start, step=step, dtype=dtype, device=device or torch.device("cpu"))


@register(aten.addmm.default, table="prims")
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if mat1.dtype in (torch.float16, torch.bfloat16):  # eager rounds once, after the bias add
        out = addmm(to_dtype(self, torch.float32), to_dtype(mat1, torch.float32), to_dtype(mat2, torch.float32),
                    beta=beta, alpha=alpha)
        return P.convert_element_type(out, mat1.dtype)
    prod = P.mm(mat1, mat2)
    if alpha != 1:
        prod = P.mul(*operands(prod, alpha, dtype=prod.dtype))
    if beta == 0:
        return prod
    bias = self if beta == 1 else P.mul(*operands(self, beta, dtype=self.dtype))
    a, b = operands(prod, bias, dtype=prod.dtype)
    return P.add(a, b)


def _extern_rule(prim):
    return lambda *args, **kwargs: prim(*args, **kwargs)


for _aten_op, _prim in EXTERN_OPS.items():
    register(_aten_op, table="prims")(_extern_rule(_prim))


@register(aten.index_select.default, table="prims")
def index_select(self, dim, index):
    if self.dim() == 0:
        return P.clone(self)
    d = canonical_dim(dim, self.dim())
    idx = P.reshape(index, [-1]) if index.dim() == 0 else index
    return aten.index.Tensor(self, [None] * d + [idx])


@register(aten.scatter.value, table="prims")
def scatter_value(self, dim, index, value):
    src = P.full(list(index.shape), value, dtype=self.dtype, device=self.device)
    return aten.scatter.src(self, dim, index, src)


@register(aten.slice_scatter.default, table="prims")
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    d = canonical_dim(dim, self.dim())
    n = self.shape[d]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, 0), n)
    if end <= start:
        return P.clone(self)
    length = -((start - end) // step)
    idx = P.iota(length, start=start, step=step, dtype=torch.int64, device=self.device)
    return aten.index_put.default(self, [None] * d + [idx], src, False)


@register(aten.select_scatter.default, table="prims")
def select_scatter(self, src, dim, index):
    d = canonical_dim(dim, self.dim())
    i = index + self.shape[d] if index < 0 else index
    return slice_scatter(self, aten.unsqueeze.default(src, d), d, i, i + 1, 1)
