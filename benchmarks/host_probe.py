"""Host cost (microseconds per call, no device sync) of what a generated wrapper does per step: the
matmul externs with and without a bias epilogue, views, allocations. Run on the GPU machine.

    python -m benchmarks.host_probe
"""

from __future__ import annotations

import time

import torch


def _us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(64, 768, device=dev, dtype=dt)  # small: the device never becomes the bottleneck
    w = torch.randn(2304, 768, device=dev, dtype=dt)
    b = torch.randn(2304, device=dev, dtype=dt)
    out = torch.empty(64, 2304, device=dev, dtype=dt)
    wt = w.t()
    aten = torch.ops.aten
    rows = {
        "aten.addmm.default(b, x, w.t-view)": lambda: aten.addmm.default(b, x, wt),
        "torch.addmm(b, x, w.t-view)": lambda: torch.addmm(b, x, wt),
        "torch.addmm(b, x, w.t-view, out=)": lambda: torch.addmm(b, x, wt, out=out),
        "aten.mm.default(x, w.t-view)": lambda: aten.mm.default(x, wt),
        "torch.mm(x, w.t-view, out=)": lambda: torch.mm(x, wt, out=out),
        "torch.matmul(x, w.t-view)": lambda: torch.matmul(x, wt),
        "w.as_strided((768, 2304), (1, 768), w.storage_offset())": lambda: w.as_strided((768, 2304), (1, 768), w.storage_offset()),
        "w.as_strided((768, 2304), (1, 768))": lambda: w.as_strided((768, 2304), (1, 768)),
        "w.t()": lambda: w.t(),
        "torch.empty_strided((64, 2304), (2304, 1))": lambda: torch.empty_strided((64, 2304), (2304, 1), dtype=dt, device=dev),
        "x.add(1) (one elementwise kernel)": lambda: x.add(1),
    }
    for name, fn in rows.items():
        print(f"  {_us(fn):7.2f} us  {name}")


if __name__ == "__main__":
    main()
