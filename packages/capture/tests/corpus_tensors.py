"""Corpus programs: straight-line tensor code."""

from __future__ import annotations

import collections  # noqa: F401
import dataclasses  # noqa: F401
import functools  # noqa: F401
import math  # noqa: F401
import operator  # noqa: F401
from typing import NamedTuple  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401
from torch import nn  # noqa: F401

from .corpus_registry import case, one, two  # noqa: F401


# ---- straight-line tensor code -------------------------------------------------------------
@case()
def add(x, y):
    return x + y


@case()
def arith_mix(x, y):
    return (x * 2 - y / 3) ** 2 % 5 // 1


@case()
def matmul_op(x, y):
    return x @ y


@case()
def torch_functions(x, y):
    return torch.sin(x) + torch.cos(y) + torch.exp(-x.abs())


@case()
def tensor_methods(x, y):
    return x.relu().sum(dim=0) + y.mean(0).sigmoid()


@case()
def functional_ops(x, y):
    return F.softmax(x, dim=-1) + F.gelu(y) + F.layer_norm(x, (4,))


@case()
def inplace_local(x, y):
    z = x.clone()
    z.add_(y)
    z.mul_(2)
    return z


@case()
def views(x, y):
    return x.view(2, 8).transpose(0, 1).reshape(-1) + y.flatten()


@case()
def indexing(x, y):
    return x[0] + x[:, 1] + x[1:3, ::2].sum() + y[..., -1]


@case()
def tensor_setitem(x, y):
    z = x.clone()
    z[0] = 1.0
    z[:, 1] = y[:, 0]
    return z


@case()
def comparison_ops(x, y):
    return (x > y).float() + (x <= 0).to(torch.float32) + torch.where(x == y, x, y)


@case()
def unary_ops(x, y):
    return -x + (+y) + ~(x > 0).int()


@case()
def factories(x, y):
    return x + torch.ones(4, 4) + torch.zeros_like(y) + torch.arange(4.0)


@case()
def shape_arith(x, y):
    b, n = x.shape
    return x.reshape(b * n) * n + y.view(-1)[: b * 2].sum()


@case()
def size_calls(x, y):
    return x.new_zeros(x.size(0), y.size(1)) + x.dim() + x.numel()


@case()
def dtype_device(x, y):
    return x.to(y.dtype).to(y.device) + torch.zeros(4, dtype=x.dtype, device=x.device)


@case()
def transpose_attr(x, y):
    return x.T @ y.mT


@case()
def cat_stack(x, y):
    return torch.cat([x, y], dim=0).sum(0) + torch.stack((x, y)).mean(0)


@case()
def split_chunks(x, y):
    a, b = x.chunk(2, dim=1)
    c, d = torch.split(y, 2)
    return a.sum() + b.sum() + c.mean() + d.mean()


@case()
def unbind_unpack(x, y):
    r0, r1, r2, r3 = x
    return r0 + r1 * r2 - r3 + y[0]


@case()
def reductions(x, y):
    return x.max(dim=0).values + torch.min(y, dim=1)[0] + x.argmax(0).float()


@case()
def returns_input(x, y):
    return x, y + 1


@case()
def returns_dict(x, y):
    return {"a": x + 1, "b": [y, x * y]}


@case()
def returns_none_and_consts(x, y):
    return None, 3, "s", x + y


@case()
def einsum_op(x, y):
    return torch.einsum("ij,jk->ik", x, y)


@case()
def where_clamp(x, y):
    return torch.where(x > 0, x, y).clamp(-0.5, 0.5)


@case()
def dropout_eval(x, y):
    return F.dropout(x, p=0.5, training=False) + y


@case()
def softmax_masked(x, y):
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    return x.masked_fill(mask, float("-inf")).softmax(-1)


@case()
def sdpa(x, y):
    q = x.view(1, 1, 4, 4)
    return F.scaled_dot_product_attention(q, q, y.view(1, 1, 4, 4), is_causal=True)
