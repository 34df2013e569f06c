"""Which operand layouts make cuBLAS fast for a matmul with an odd N (GPT-2's 50257-word LM head,
BERT's 30522)? Times each variant of the same product on the GPU.

    python -m benchmarks.mm_layout_probe
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the probe's Triton rows need it; the cuBLAS rows do not
    triton = None


if triton is not None:
    @triton.jit
    def _mm_kernel(a, b, bias, c, M, N, K, sam, sak, sbk, sbn, scm, scn, HAS_BIAS: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        """``c = a @ b (+ bias)`` stored straight into ``c`` whatever its row stride (masked stores)."""
        pid = tl.program_id(0)
        grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        width = GROUP_M * grid_n
        group = pid // width
        first_m = group * GROUP_M
        size_m = min(grid_m - first_m, GROUP_M)
        pm = first_m + (pid % width) % size_m
        pn = (pid % width) // size_m
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            x = tl.load(a + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                        mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
            y = tl.load(b + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                        mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(x, y)
        if HAS_BIAS:
            acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_mm(a, b, bias, cfg):
    """``a @ b (+ bias)`` by the probe's Triton kernel into a new contiguous (unaligned) result."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    bm, bn, bk, warps, stages = cfg
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _mm_kernel[grid](a, b, bias if bias is not None else a, c, m, n, k, a.stride(0), a.stride(1),
                     b.stride(0), b.stride(1), c.stride(0), c.stride(1), HAS_BIAS=bias is not None,
                     BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
    return c


def _ms(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    for m, k, n, bias in ((4096, 768, 50257, False), (4096, 768, 30522, True), (2048, 1024, 32000, False)):
        _probe(m, k, n, bias)


def _probe(m: int, k: int, n: int, bias: bool) -> None:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt)
    w = torch.randn(n, k, device=dev, dtype=dt)
    b = torch.randn(n, device=dev, dtype=dt) if bias else None
    npad = (n + 7) // 8 * 8
    out_pad = torch.empty(m, npad, device=dev, dtype=dt)[:, :n]
    wt = w.t().contiguous()
    wpad = torch.zeros(npad, k, device=dev, dtype=dt)
    wpad[:n] = w
    bpad = torch.zeros(npad, device=dev, dtype=dt) if bias else None
    if bias:
        bpad[:n] = b

    def mm(a, bt, bb=None, out=None):
        if bb is None:
            return torch.mm(a, bt, out=out) if out is not None else torch.mm(a, bt)
        return torch.addmm(bb, a, bt, out=out) if out is not None else torch.addmm(bb, a, bt)

    ref = mm(x, w.t(), b)
    rows = {
        "x @ W.t() (eager, kiln today)": lambda: mm(x, w.t(), b),
        "x @ W.t().contiguous() (copy each call)": lambda: mm(x, w.t().contiguous(), b),
        "x @ Wt (Wt contiguous, no copy timed)": lambda: mm(x, wt, b),
        "out= padded rows (ldc % 8 == 0)": lambda: mm(x, w.t(), b, out=out_pad),
        "x @ Wpad.t() then [:, :n] (pad weight once)": lambda: mm(x, wpad.t(), bpad)[:, :n],
        "copy W.t() into contiguous only": lambda: wt.copy_(w.t()),
        "W @ x.t() then .t().contiguous() (transposed product)":
            lambda: (mm(w, x.t()) if b is None else torch.addmm(b[:, None], w, x.t())).t().contiguous(),
        "pad W per call, product, [:, :n].contiguous()":
            lambda: mm(x, torch.nn.functional.pad(w, (0, 0, 0, npad - n)).t(),
                       None if b is None else torch.nn.functional.pad(b, (0, npad - n)))[:, :n].contiguous(),
    }
    from kiln.inductor.graph_passes.pad_matmuls import BLOCK, mm_padded_blocks
    rows["kiln mm_padded (blocks into the result)"] = lambda: mm_padded_blocks(b, x, w.t(), m, BLOCK)
    if triton is not None:
        for cfg in ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4),
                    (64, 256, 64, 4, 4)):
            rows[f"triton {cfg} unaligned store"] = lambda cfg=cfg: triton_mm(x, w.t(), b, cfg)
    print(f"== M={m} K={k} N={n} bias={bias}")
    for name, fn in rows.items():
        ms = _ms(fn)
        err = ""
        if "only" not in name:
            got = fn()
            err = f" maxerr {float((got.float() - ref.float()).abs().max()):.3g}"
        print(f"  {ms:7.3f} ms  {name}{err}")


if __name__ == "__main__":
    main()
