"""On the CPU a transcendental read broadcast is stored once, not recomputed per element that reads it.

A Llama's rotary ``cos``/``sin`` of shape (batch, 1, seq, head_dim) is read by the query's and the
key's rotation over every head. Left lazy, each rotated element evaluated its own ``cos`` and ``sin``;
the tiny Llama serving stream (``python -m benchmarks.dynamic_stream --together``) spent ~5% of its
time in those libm calls and ran ~12% behind torch.compile. Softmax's ``exp`` (read at its own size by
its sum and its division) stays inlined: the C++ kernel caches it per row."""

from __future__ import annotations

import torch
from helpers import check

from kiln.inductor.ir import ComputedBuffer, Op, walk


def _rope(q, k, pos, inv_freq):
    freqs = pos[:, :, None].float() * inv_freq[None, None, :]  # (b, s, d/2)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # (b, 1, s, d): broadcast over heads

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _buffers_computing(cg, name: str) -> list[ComputedBuffer]:
    nodes = cg.loop_program.nodes  # type: ignore[attr-defined]
    return [n for n in nodes if isinstance(n, ComputedBuffer)
            and any(type(e) is Op and e.name == name for e in walk(n.data.body))]


def _rope_args(b: int, h: int, s: int, d: int) -> tuple:
    torch.manual_seed(0)
    return (torch.randn(b, h, s, d), torch.randn(b, h, s, d), torch.arange(s).expand(b, s).contiguous(),
            1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))


def test_rotary_cos_and_sin_are_stored_once_per_position():
    args = _rope_args(2, 4, 9, 16)
    cg = check(_rope, *args)
    for fn in ("cos", "sin"):
        stored = _buffers_computing(cg, fn)
        assert stored, f"{fn} was not computed in any buffer"
        for buf in stored:  # computed at (b, 1, s, d), never at the heads' (b, h, s, d)
            assert 4 not in tuple(buf.layout.shape), (fn, buf.layout.shape)


def test_rotary_values_over_fresh_inputs():
    for b, h, s, d in ((1, 2, 5, 8), (3, 4, 17, 16), (2, 1, 1, 32)):
        check(_rope, *_rope_args(b, h, s, d))


def test_softmax_exp_stays_inlined():
    def softmax(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)
    cg = check(softmax, torch.randn(8, 33))
    full = [b for b in cg.loop_program.nodes  # type: ignore[attr-defined]
            if isinstance(b, ComputedBuffer) and tuple(b.layout.shape) == (8, 33)]
    assert len(full) == 1, f"softmax's exp was stored as a buffer of its own: {full}"  # only the output
