"""The built-in models ``kiln demo`` compiles: a small transformer block and an MLP."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d: int = 256, hidden: int = 1024, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d if i == 0 else hidden, hidden) for i in range(depth))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(self.norm(x))


class TransformerBlock(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def demo_models(device: torch.device, seed: int = 0) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """(name, model, input) triples, deterministic for a seed so a fresh process rebuilds them."""
    torch.manual_seed(seed)
    block = TransformerBlock().to(device).eval()
    mlp = MLP().to(device).eval()
    return [
        ("transformer", block, torch.randn(8, 64, 256, device=device)),
        ("mlp", mlp, torch.randn(64, 256, device=device)),
    ]
