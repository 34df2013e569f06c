"""The two example models: a small pre-norm transformer over token ids, and a ResNet-18-shaped CNN
(torchvision's layout, written here so the example needs no torchvision)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2, ctx: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class PaddedTransformer(nn.Module):
    """The transformer over a batch of padded sequences: ``keep`` (1.0 for tokens, 0.0 for padding, shaped
    like ``ids``) zeroes the logits of padding positions. Exported with a dynamic batch and sequence dim
    (``DYNAMIC``); the two inputs share both dims, a relation the package checks."""

    def __init__(self, **kw: int) -> None:
        super().__init__()
        self.tf = TinyTransformer(**kw)

    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.tf(ids) * keep.unsqueeze(-1)


# batch in [2, 8], sequence in [2, 64] (the position table's length); sizes 0 and 1 would need another export
DYNAMIC = {"ids": {0: (2, 8), 1: (2, 64)}, "keep": {0: (2, 8), 1: (2, 64)}}
# (batch, sequence) sizes the example checks: the range's corners, and primes
DYNAMIC_SIZES = ((3, 17), (2, 2), (8, 64), (5, 31), (7, 13))


def padded_inputs(batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (batch, seq), generator=g)
    lengths = torch.randint(1, seq + 1, (batch, 1), generator=g)
    return ids, (torch.arange(seq) < lengths).float()


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18's layout (2-2-2-2 basic blocks); ``width`` scales the channels (64 is the real one)."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], w
        for k, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            layers += [BasicBlock(cin, cout, 1 if k == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def randomize_batch_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial running statistics, so the check exercises them (fresh ones are 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def example(name: str, small: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model in eval mode, example inputs) by name: "transformer", "padded_transformer" (exported with
    ``DYNAMIC`` shapes) or "resnet18"."""
    torch.manual_seed(0)
    if name == "transformer":
        model = TinyTransformer(layers=2 if small else 4)
        return model.eval(), (torch.randint(0, 256, (2, 32 if small else 64)),)
    if name == "padded_transformer":
        return PaddedTransformer(layers=2 if small else 4).eval(), padded_inputs(*DYNAMIC_SIZES[0])
    if name == "resnet18":
        model = randomize_batch_norms(ResNet18(width=16 if small else 64, classes=100 if small else 1000))
        return model.eval(), (torch.randn(1, 3, 64 if small else 224, 64 if small else 224),)
    raise ValueError(f"unknown example model {name!r}: use 'transformer', 'padded_transformer' or 'resnet18'")
