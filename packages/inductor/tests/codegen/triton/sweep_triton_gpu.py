"""Block-size sweep for column reductions and long looped rows (run by hand on the GPU machine)."""

import torch
from triton.testing import do_bench

from kiln.inductor.codegen.triton import TritonConfig, TritonKernels
from kiln.inductor.codegen.triton.testing import kernel, load, node, rs, xs


def col_sum(a):
    (x0,), (r0,) = xs(1), rs(1)
    at = a.t()
    return kernel("k_col", [at.shape[0]], [at.shape[1]],
                  [node("out", load("a", [x0, r0], at), x0, role="outer", kind="reduction", reduction_type="sum")])


def row_sum(a):
    (x0,), (r0,) = xs(1), rs(1)
    return kernel("k_row", [a.shape[0]], [a.shape[1]],
                  [node("out", load("a", [x0, r0], a), x0, role="outer", kind="reduction", reduction_type="sum")])


def bench(k, a, out, cfg):
    tk = TritonKernels([k], cfg)
    bufs = {"a": a, "out": out}
    tk.run(bufs)
    g = tk.generated[0]
    t = do_bench(lambda: tk.launch(0, bufs))
    return t * 1e3, g


a = torch.randn(4096, 4096, device="cuda")
out = torch.empty(4096, device="cuda")
print("eager col", do_bench(lambda: a.sum(0)) * 1e3)
for xb, tile, mx in [(16, 2048, 16), (32, 2048, 32), (64, 2048, 64), (64, 4096, 64), (32, 4096, 32),
                     (128, 4096, 128), (64, 8192, 64), (32, 1024, 32), (8, 1024, 8)]:
    cfg = TritonConfig(col_min_xblock=xb, col_tile=tile, max_xblock_rows=mx)
    t, g = bench(col_sum(a), a, out, cfg)
    assert torch.allclose(out, a.sum(0), atol=1e-2), "wrong"
    print(f"col X={g.xblock} R={g.rblock} warps={g.num_warps}: {t:.1f}us")
b = torch.randn(1024, 32000, device="cuda")
out = torch.empty(1024, device="cuda")
print("eager row32000", do_bench(lambda: b.sum(1)) * 1e3)
for rb, elems in [(1024, 4096), (2048, 8192), (4096, 16384), (512, 4096), (2048, 2048 * 4 * 2)]:
    cfg = TritonConfig(looped_rblock=rb, row_block_elems=elems)
    t, g = bench(row_sum(b), b, out, cfg)
    print(f"row X={g.xblock} R={g.rblock} warps={g.num_warps}: {t:.1f}us")
