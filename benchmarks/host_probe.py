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
    x3 = x.view(2, 32, 768)
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
        # a linear over a 3-D activation, the shape LM blocks have: viewed to 2-D around mm, or one call
        "x3.as_strided 2-D + w.as_strided + torch.mm + .stride()": lambda: torch.mm(
            x3.as_strided((64, 768), (768, 1), 0), w.as_strided((768, 2304), (1, 768), 0)).stride(),
        "torch._C._nn.linear(x3, w)": lambda: torch._C._nn.linear(x3, w),
        "torch._C._nn.linear(x3, w, b)": lambda: torch._C._nn.linear(x3, w, b),
        "torch.nn.functional.linear(x3, w)": lambda: torch.nn.functional.linear(x3, w),
        "torch.mm(x, w.t-view) (no out)": lambda: torch.mm(x, wt),
        "x.view(2, 32, 2304)": lambda: out.view(2, 32, 2304),
        "torch.ops.aten.view.default(out, [2, 32, 2304])": lambda: aten.view.default(out, [2, 32, 2304]),
    }
    # convolutions (ResNet-50's 3x3 stage-1 conv at batch 2): NCHW, channels-last, mixed
    xi = torch.randn(2, 64, 56, 56, device=dev, dtype=dt)
    wi = torch.randn(64, 64, 3, 3, device=dev, dtype=dt)
    xc, wc = xi.to(memory_format=torch.channels_last), wi.to(memory_format=torch.channels_last)
    conv = torch.convolution
    rows.update({
        "torch.convolution NCHW x, NCHW w": lambda: conv(xi, wi, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "torch.convolution NHWC x, NHWC w": lambda: conv(xc, wc, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "torch.convolution NHWC x, NCHW w": lambda: conv(xc, wi, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "aten.convolution.default NHWC x, NHWC w": lambda: aten.convolution.default(
            xc, wc, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "torch.nn.functional.conv2d NHWC x, NHWC w": lambda: torch.nn.functional.conv2d(xc, wc, None, 1, 1),
        "torch.nn.functional.conv2d NCHW x, NCHW w": lambda: torch.nn.functional.conv2d(xi, wi, None, 1, 1),
    })
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        for name, fn in rows.items():
            if bench and "conv" not in name:
                continue
            print(f"  {_us(fn):7.2f} us  {name}{'  [cudnn.benchmark]' if bench else ''}")


if __name__ == "__main__":
    main()
