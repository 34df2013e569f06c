"""Llama's attention preparation alone (rotary embedding of q and k, as transformers computes it: position x
inverse frequency as a [B, D/2, 1] @ [B, 1, S] bmm, cat, cos/sin, rotate_half; q/k viewed [B, H, S, D]
from the projections' [B, S, H * D]), kiln vs torch.compile, at Llama-350M's suite sizes (B=4, S=512,
H=16, D=64, bf16). GPU only; about 30 s, most of it torch.compile's compile.

    uv run python -m benchmarks.rope_probe [--iters 200]

Prints the kernels' device time per call of each compiled function (torch.profiler over ``--iters``
calls) and each kernel's share; ``KILN_DEBUG_DIR=DIR`` also writes
kiln's generated kernels (DIR/*/output_code.txt). The device kernel of the profile
(``k9__scaled_dot_product_cudnn_attention``, 23 us vs torch.compile's 8.8 us at f2fe687) is this
pattern: the bmm ran as an extern and its [B, D/2, S] result was read transposed by a 2-D tiled kernel
(64 x 64 tile, 32 elements a thread, register spills); now the bmm is a broadcast multiply inside one
1-D kernel, as torch.compile's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


def rotary_prep(inv_freq: torch.Tensor, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, _ = q.shape
    inv = inv_freq[None, :, None].float().expand(b, -1, 1)
    freqs = (inv @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(q.dtype)[:, None], emb.sin().to(q.dtype)[:, None]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)
    q, k = (t.view(b, s, -1, inv_freq.shape[0] * 2).transpose(1, 2) for t in (q, k))
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def kernel_us(fn, args: tuple, iters: int) -> tuple[float, dict[str, float]]:
    """Device time of ``fn``'s kernels per call (torch.profiler, so the host's launch time, which exceeds a
    10 us kernel's, does not count), and per kernel name."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*args)
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t and e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.key] = per.get(e.key, 0.0) + t / iters
    return sum(per.values()), per


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("rope_probe: needs a CUDA GPU")
        return 1
    import kiln

    b, s, h, d = a.batch, a.seq, 16, 64
    dev = torch.device("cuda")
    inv_freq = (1.0 / (10000 ** (torch.arange(0, d, 2, device=dev).float() / d))).to(torch.bfloat16)
    positions = torch.arange(s, device=dev).repeat(b, 1)
    q, k = (torch.randn(b, s, h * d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    args = (inv_freq, positions, q, k)
    eager = rotary_prep(*args)
    ours = kiln.compile(rotary_prep)
    theirs = torch.compile(rotary_prep)
    with torch.no_grad():
        for name, fn in (("kiln", ours), ("torch.compile", theirs)):
            got = fn(*args)
            err = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, eager))
            total, per = kernel_us(fn, args, a.iters)
            print(f"{name:14s} {total:8.2f} us of kernels a call  (max |diff| vs eager {err:.3g})")
            for kname, us in sorted(per.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.2f} us  {kname[:110]}")
    print(f"B={b} S={s} H={h} D={d} bf16; {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
