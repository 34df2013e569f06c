"""A Llama-style decoder with a static KV cache, for the bs=1 decode benchmark (issue 8).

Full size (``DecodeConfig()``): 12 layers, d=1024, 16 heads (head dim 64), SwiGLU FFN 6144, vocab
32000, untied embeddings, KV cache of 512 positions: about 342M parameters, bf16. One ``forward`` is
one decode step: it takes the previous token (1, 1) and its position (1,), writes this step's keys and
values into the cache buffers in place, attends over the cache with a mask of the positions filled so
far, and returns the greedy next token (1, 1) -- which the loop feeds back in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    vocab: int = 32000
    dim: int = 1024
    n_layers: int = 12
    n_heads: int = 16
    ffn: int = 6144
    max_seq: int = 512
    rope_base: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


TINY = DecodeConfig(vocab=512, dim=64, n_layers=2, n_heads=4, ffn=128, max_seq=64)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * \
            self.weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (B, H, T, D) with cos/sin of shape (T, D/2)."""
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: DecodeConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        shape = (1, cfg.n_heads, cfg.max_seq, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                input_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, cfg: DecodeConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: DecodeConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                input_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, input_pos, mask)
        return x + self.ffn(self.ffn_norm(x))


class Decoder(nn.Module):
    """One greedy decode step per call: (token (1, 1), input_pos (1,)) -> next token (1, 1)."""

    def __init__(self, cfg: DecodeConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        inv = 1.0 / cfg.rope_base ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.max_seq).float(), inv)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(cfg.max_seq), persistent=False)

    def forward(self, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(token)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        mask = (self.positions <= input_pos).view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, cos, sin, input_pos, mask)
        logits = self.output(self.norm(x))
        return logits.argmax(-1)

    @torch.no_grad()
    def reset_cache(self) -> None:
        for layer in self.layers:
            layer.attn.k_cache.zero_()
            layer.attn.v_cache.zero_()


def build_decoder(cfg: DecodeConfig, device: str | torch.device, dtype: torch.dtype,
                  seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    with torch.device(device):
        model = Decoder(cfg)
    # Keep the rope tables in fp32 (they are indexed, not multiplied into weights).
    cos, sin = model.rope_cos, model.rope_sin
    model.to(dtype)
    model.rope_cos, model.rope_sin = cos, sin
    for m in model.modules():  # small init keeps bf16 activations in range over 12 layers
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
    return model.eval()


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
