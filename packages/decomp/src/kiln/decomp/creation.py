"""Tensor factories and identity-like ops: zeros/ones/empty(_like), new_*, arange, detach, lift_fresh."""

from __future__ import annotations

import torch

from .common import aten
from .registry import Family

FAMILY = Family("creation")
register = FAMILY.register


def _dtype(dtype, default=None):
    return dtype if dtype is not None else (default if default is not None else torch.get_default_dtype())


@register(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 0, dtype=_dtype(dtype), device=device)


@register(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 1, dtype=_dtype(dtype), device=device)


def _like(self, value, dtype, device, memory_format):
    if memory_format is None or memory_format == torch.preserve_format:
        return aten.full_like.default(self, value, dtype=dtype or self.dtype, device=device or self.device)
    return aten.full_like.default(self, value, dtype=dtype or self.dtype, device=device or self.device,
                                  memory_format=memory_format)


@register(aten.zeros_like.default)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _like(self, 0, dtype, device, memory_format)


@register(aten.ones_like.default)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _like(self, 1, dtype, device, memory_format)


@register(aten.empty_like.default)
def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # Note: empty values are unspecified; a zero fill is a valid (and deterministic) choice.
    return _like(self, 0, dtype, device, memory_format)


@register(aten.rand_like.default)
def rand_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.rand.default(list(self.shape), dtype=dtype or self.dtype, device=device or self.device)


@register(aten.randn_like.default)
def randn_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.randn.default(list(self.shape), dtype=dtype or self.dtype, device=device or self.device)


@register(aten.new_zeros.default)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 0, dtype=dtype or self.dtype, device=device or self.device)


@register(aten.new_ones.default)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 1, dtype=dtype or self.dtype, device=device or self.device)


@register(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), fill_value, dtype=dtype or self.dtype, device=device or self.device)


@register(aten.new_empty.default)
def new_empty(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.empty.memory_format(list(size), dtype=dtype or self.dtype, device=device or self.device)


@register(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.empty_strided.default(list(size), list(stride), dtype=dtype or self.dtype,
                                      device=device or self.device)


@register(aten.arange.default)
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(0, end, 1, dtype=dtype, device=device)


@register(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(start, end, 1, dtype=dtype, device=device)


@register(aten.detach.default)
def detach(self):
    return aten.alias.default(self)


@register(aten.lift_fresh.default)
def lift_fresh(self):
    return aten.alias.default(self)


@register(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return aten.clone.default(self)


@register(aten.zero.default)
def zero(self):
    return aten.full_like.default(self, 0)


@register(aten.fill.Tensor)
def fill_tensor(self, value):
    return aten.clone.default(aten.expand.default(aten._to_copy.default(value, dtype=self.dtype), list(self.shape)))


@register(aten.bernoulli.default)
def bernoulli(self, *, generator=None):
    if generator is not None:
        return NotImplemented
    return aten._to_copy.default(aten.lt.Tensor(aten.rand.default(list(self.shape), dtype=self.dtype, device=self.device), self), dtype=self.dtype)


@register(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = dtype or torch.get_default_dtype()
    if steps == 1:
        return aten.full.default([1], start, dtype=dt, device=device)
    idx = aten.arange.start_step(0, steps, 1, dtype=torch.float64 if dt == torch.float64 else torch.float32, device=device)
    step = (end - start) / max(steps - 1, 1)
    # compute from both ends to stay symmetric like eager
    half = steps // 2
    lo = aten.add.Tensor(aten.mul.Tensor(idx, step), start)
    hi = aten.sub.Tensor(end, aten.mul.Tensor(aten.rsub.Scalar(idx, steps - 1), step))
    out = aten.where.self(aten.lt.Scalar(idx, half), lo, hi)
    return aten._to_copy.default(out, dtype=dt)
