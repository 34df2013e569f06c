"""Matrix products outside the core set: linear, baddbmm, addbmm, addmv, mv, dot, outer, matmul."""

from __future__ import annotations

import torch

from .common import aten, reshape
from .registry import Family

FAMILY = Family("linalg")
register = FAMILY.register


def _scaled(x, s):
    return x if s == 1 else aten.mul.Tensor(x, s)


@register(aten.linear.default)
def linear(input, weight, bias=None):
    wt = aten.permute.default(weight, [1, 0]) if weight.dim() == 2 else weight
    if input.dim() == 2 and weight.dim() == 2 and bias is not None:
        return aten.addmm.default(bias, input, wt)
    lead = list(input.shape[:-1])
    x2 = reshape(input, [-1, input.shape[-1]]) if input.dim() != 2 else input
    if weight.dim() == 1:
        out = aten.view.default(aten.mm.default(x2, aten.unsqueeze.default(weight, 1)), lead)
    else:
        out = aten.mm.default(x2, wt)
        out = aten.view.default(out, lead + [weight.shape[0]]) if input.dim() != 2 else out
    return aten.add.Tensor(out, bias) if bias is not None else out


@register(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    prod = _scaled(aten.bmm.default(batch1, batch2), alpha)
    if beta == 0:  # self is ignored, NaNs included
        return prod
    return aten.add.Tensor(_scaled(self, beta), prod)


@register(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    if batch1.dtype in (torch.float16, torch.bfloat16) and batch1.shape[0] <= 64:
        # eager accumulates one addmm per batch entry, rounding each time; match it
        out = _scaled(self, beta) if beta != 0 else aten.full.default(
            [batch1.shape[1], batch2.shape[2]], 0, dtype=batch1.dtype, device=batch1.device)
        out = aten.expand.default(out, [batch1.shape[1], batch2.shape[2]])
        for b in range(batch1.shape[0]):
            out = aten.addmm.default(out, aten.select.int(batch1, 0, b), aten.select.int(batch2, 0, b), alpha=alpha)
        return out
    prod = _scaled(aten.sum.dim_IntList(aten.bmm.default(batch1, batch2), [0]), alpha)
    if beta == 0:
        return aten.clone.default(prod)
    return aten.add.Tensor(_scaled(self, beta), prod)


@register(aten.mv.default)
def mv(self, vec):
    return aten.squeeze.dims(aten.mm.default(self, aten.unsqueeze.default(vec, 1)), [1])


@register(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    prod = _scaled(mv(mat, vec), alpha)
    if beta == 0:
        return aten.clone.default(prod)
    return aten.add.Tensor(_scaled(self, beta), prod)


@register(aten.dot.default, aten.vdot.default)
def dot(self, tensor):
    return aten.sum.default(aten.mul.Tensor(self, tensor))


@register(aten.outer.default)
def outer(self, vec2):
    return aten.mul.Tensor(aten.unsqueeze.default(self, 1), aten.unsqueeze.default(vec2, 0))


@register(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    prod = _scaled(outer(vec1, vec2), alpha)
    if beta == 0:
        return aten.clone.default(prod)
    return aten.add.Tensor(_scaled(self, beta), prod)
