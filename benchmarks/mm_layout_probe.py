"""Which operand layouts make cuBLAS fast for a matmul with an odd N (GPT-2's 50257-word LM head,
BERT's 30522)? Times each variant of the same product on the GPU.

    python -m benchmarks.mm_layout_probe
"""

from __future__ import annotations

import torch


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
    }
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
