"""Corpus programs: nn.Module calls, containers, context managers."""

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

from .corpus_python import Affine
from .corpus_registry import case, one, two  # noqa: F401


# ---- modules -------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


_MLP = MLP()


@case(args=one)
def module_call(x):
    return _MLP(x)


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.scale + self.w


_WB = WithBuffers()


@case(args=one)
def module_buffers(x):
    return _WB(x)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.norms = nn.ModuleDict({"a": nn.LayerNorm(4), "b": nn.LayerNorm(4)})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        x = self.norms["a"](x) + self.norms["b"](x)
        for name in self.norms:
            x = x + self.norms[name].weight
        return self.seq(x) + self.layers[-1](x) + len(self.layers)


_STACK = Stack()


@case(args=one)
def module_containers(x):
    return _STACK(x)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x)))).flatten(1)


_CONV = Conv().eval()


@case(args=lambda: (torch.randn(2, 3, 8, 8),))
def conv_module(x):
    return _CONV(x)


class TiedEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


_TIED = TiedEmbed()


@case(args=lambda: (torch.randint(0, 10, (2, 3)),))
def tied_weights(ids):
    return _TIED(ids)


class Attention(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        att = att.softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, n, c))


_ATTN = Attention()


@case(args=lambda: (torch.randn(2, 5, 8),))
def attention_module(x):
    return _ATTN(x)


class FunctionalModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def helper(self, x):
        return x @ self.w

    def forward(self, x):
        return self.helper(x).tanh() + self.training


_FM = FunctionalModule().eval()


@case(args=one)
def module_methods(x):
    return _FM(x)


@case()
def autocast_block(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = torch.mm(x, y)
    return z.float() + 1


class Scaled:
    def __init__(self, k):
        self.k = k
        self.entered = False

    def __enter__(self):
        self.entered = True
        return self.k

    def __exit__(self, *exc):
        self.entered = False
        return False


@case()
def user_context_manager(x, y):
    with Scaled(3) as k:
        z = x * k
    return z + y


@case()
def nullcontext_block(x, y):
    import contextlib
    with contextlib.nullcontext():
        z = x + y
    return z


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})

    @property
    def width(self):
        return self.proj.out_features // 2

    def forward(self, x):
        a, b = self.proj(x).split(self.width, dim=-1)
        out = a * torch.sigmoid(b)
        for name, block in self.blocks.items():
            out = out + block(x) * len(name)
        return out


_GATE = Gate()


@case(args=one)
def module_property_moduledict(x):
    return _GATE(x)


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


_RES = nn.Sequential(Residual(nn.Linear(4, 4)), Residual(nn.Sequential(nn.ReLU(), nn.Linear(4, 4))))


@case(args=one)
def nested_modules(x):
    return _RES(x)


@case(args=one)
def module_parameters_loop(x):
    total = x
    for p in _MLP.parameters():
        total = total + p.sum()
    return total


@case(args=one)
def module_named_children(x):
    for _name, child in _STACK.seq.named_children():
        if isinstance(child, nn.Linear):
            x = child(x)
    return x


@case()
def list_of_lists(x, y):
    grid = [[x, y], [y, x]]
    return sum(sum(row) for row in grid)


@case()
def dict_of_tuples(x, y):
    d = {"p": (x, 1), "q": (y, 2)}
    return sum(t * k for t, k in d.values())


@case()
def tensor_iteration(x, y):
    out = y[0]
    for row in x:
        out = out + row
    return out


@case()
def slice_assign_list(x, y):
    xs = [x, x, x]
    xs[1:] = [y, y]
    return sum(xs)


@case()
def bool_ops_on_python(x, y):
    flags = [True, False, True]
    n = sum(1 for f in flags if f)
    return x * n if any(flags) and not all(flags) else y


@case()
def math_functions(x, y):
    return x * math.cos(0.0) + y * math.exp(1.0) + math.ceil(1.2) + math.gcd(12, 8)


@case()
def divmod_pow(x, y):
    q, r = divmod(17, 5)
    return x * q + y * r + pow(2, 3)


@case()
def min_max_key(x, y):
    pairs = [(3, "c"), (1, "a"), (2, "b")]
    lo = min(pairs, key=lambda p: p[0])
    hi = max(pairs)
    return x * lo[0] + y * hi[0]


@case()
def enumerate_start(x, y):
    out = x
    for i, t in enumerate([x, y], start=5):
        out = out + t * i
    return out


@case()
def zip_three(x, y):
    out = x * 0
    for a, b, c in zip([x, y], [y, x], [1, 2]):
        out = out + a * b * c
    return out


@case()
def chained_methods(x, y):
    return x.abs().add(1).log().mul(y).sum(dim=1, keepdim=True).expand(4, 4).contiguous()


@case()
def inplace_python_list_of_tensors(x, y):
    acc = []
    for i in range(3):
        acc.append(x * i)
    acc[0] = y
    return torch.cat(acc, dim=0)


@case()
def keyword_only_torch(x, y):
    return torch.sum(x, dim=0, keepdim=True) + torch.nn.functional.normalize(y, p=2.0, dim=-1)


@case()
def torch_tensor_factory(x, y):
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    return x + t + torch.full((4,), 2.0) + torch.eye(4)


@case()
def type_conversion_methods(x, y):
    return x.int().float() + y.long().to(torch.float32) + x.half().float()


@case()
def masked_ops(x, y):
    m = x > 0
    return torch.where(m, x, torch.zeros_like(x)) + y.masked_fill(~m, 0.0)


@case()
def global_module_function(x, y):
    return F.relu(x) + torch.nn.functional.silu(y)


@case()
def class_attribute_read(x, y):
    return x * Affine.make(2).k + y


@case()
def nested_dict_access(x, y):
    cfg = {"model": {"scale": 2, "layers": [1, 2, 3]}}
    return x * cfg["model"]["scale"] + y * len(cfg["model"]["layers"])
