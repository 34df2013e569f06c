"""Small models end to end (inference): a CNN and a transformer block stack, compared with eager."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import check


class Block(nn.Module):
    def __init__(self, d: int = 32, h: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.f1, self.f2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.f2(F.gelu(self.f1(self.ln2(x))))


def _functional(model: nn.Module):
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    tensors = list(model.parameters()) + list(model.buffers())

    def f(x, *ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (x,))
    return f, tensors


def test_transformer_blocks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).eval()
    f, ps = _functional(model)
    check(f, torch.randn(2, 16, 32), *ps, atol=1e-4, rtol=1e-4)


def test_small_cnn() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.Hardswish(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10), nn.LogSoftmax(-1)).eval()
    f, ps = _functional(model)
    check(f, torch.randn(2, 3, 16, 16), *ps, atol=1e-4, rtol=1e-4)


def test_mlp_with_dropout_in_eval_and_embedding() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(50, 16)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Dropout(0.1), nn.Linear(32, 16), nn.LayerNorm(16)).eval()

    def f(ids, w, *ps):
        names = [n for n, _ in mlp.named_parameters()]
        h = F.embedding(ids, w)
        return torch.func.functional_call(mlp, dict(zip(names, ps)), (h,)).mean(1)
    check(f, torch.randint(0, 50, (3, 7)), emb.weight.detach(), *[p.detach() for p in mlp.parameters()],
          atol=1e-5, rtol=1e-4)
