"""More ops with symbolic sizes (factories, padding, scans, gathers, scatters, pooling through ATen,
convolutions, attention): each compiled once and called over several sizes, C++ and Triton."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dynamic_helpers import BACKENDS, assumed, check_sizes, compile_symbolic

from kiln.inductor.ir import ExternKernel


def _pad_rows(x: torch.Tensor) -> torch.Tensor:
    s = x.shape[-1]
    rows = torch.zeros(*x.shape[:-1], (s + 15) // 16 * 16)
    return torch.slice_scatter(rows, x, -1, 0, s)[..., :s] * 2


CASES = {
    "arange": (lambda x: (torch.arange(x.shape[0]) * x.sum(1),), lambda n: (torch.randn(n, 4),)),
    "zeros": (lambda x: (torch.zeros(x.shape[0], 3) + x[:, :1],), lambda n: (torch.randn(n, 4),)),
    "expand": (lambda x, y: (x.expand(y.shape[0], -1) * y,), lambda n: (torch.randn(1, 4), torch.randn(n, 4))),
    "pad": (lambda x: (F.pad(x, (1, 2)),), lambda n: (torch.randn(n, 4),)),
    "cumsum": (lambda x: (x.cumsum(1),), lambda n: (torch.randn(3, n),)),
    "index_select": (lambda x, i: (x.index_select(0, i),),
                     lambda n: (torch.randn(n, 4), torch.randint(0, max(n, 1), (5,)))),
    "where": (lambda x: (torch.where(x > 0, x, 0.5),), lambda n: (torch.randn(n, 4),)),
    "avg_pool": (lambda x: (F.avg_pool2d(x, 2),), lambda n: (torch.randn(2, 3, 2 * n, 8),)),
    "max_pool": (lambda x: (F.max_pool2d(x, 2),), lambda n: (torch.randn(2, 3, 2 * n, 8),)),
    "repeat": (lambda x: (x.repeat(2, 1),), lambda n: (torch.randn(n, 4),)),
    "bmm": (lambda a, b: (torch.bmm(a, b),), lambda n: (torch.randn(3, n, 4), torch.randn(3, 4, n))),
    "split": (lambda x: tuple(t * 2 for t in x.split(2, 1)), lambda n: (torch.randn(n, 6),)),
    "var_std": (lambda x: (x.var(1), x.std(0)), lambda n: (torch.randn(n, 6),)),
    "argmax": (lambda x: (x.argmax(1), x.max(0).values), lambda n: (torch.randn(6, n),)),
    "conv": (lambda x, w: (F.conv2d(x, w, padding=1).relu(),),
             lambda n: (torch.randn(2, 3, n, n), torch.randn(4, 3, 3, 3))),
    "index_add": (lambda x, i: (torch.zeros(5, 4).index_add(0, i, x),),
                  lambda n: (torch.randn(n, 4), torch.randint(0, 5, (n,)))),
    # arange's length is CeilToInt(IntTrueDiv(n, 32)) in the ShapeEnv: a size rounded from a true division
    "arange_step": (lambda x: (torch.arange(0, x.shape[0], 32) * 2, x[::32] + 1),
                    lambda n: (torch.randn(n, 4),)),
    # symbolic attention's bias rows padded to 16 (kiln.autograd attention.py): zeros + slice_scatter
    "slice_scatter_pad": (lambda x: (_pad_rows(x),), lambda n: (torch.randn(2, 3, n),)),
    "slice_scatter_mid": (lambda x, y: (torch.slice_scatter(x, y, 1, 2, 2 + y.shape[1]),),
                          lambda n: (torch.randn(3, n + 4), torch.randn(3, n))),
    "sdpa_causal": (lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, is_causal=True),),
                    lambda n: tuple(torch.randn(2, 2, n, 8) for _ in range(3))),
}
# sizes the graph's semantics allow (argmax of an empty row, pooling or convolving an empty image,
# indexing an empty tensor are errors in eager; ATen's CPU flash attention, which the trace recorded,
# crashes on an empty sequence where eager's sdpa picks another kernel)
POSITIVE = (1, 2, 3, 5, 11)
SIZES = {"argmax": (2, 3, 5, 11), "max_pool": POSITIVE, "avg_pool": POSITIVE, "conv": POSITIVE,
         "index_select": POSITIVE, "sdpa_causal": POSITIVE}


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_over_sizes(name, options):
    fn, make_args = CASES[name]
    cg = compile_symbolic(fn, *make_args(37), options=options)
    p = cg.loop_program  # type: ignore[attr-defined]
    assert p.sizes and not assumed(p), p.as_text()
    check_sizes(cg, fn, make_args, SIZES.get(name, (2, 3, 1, 0, 5, 11)), atol=1e-4)


@pytest.mark.parametrize("name", ["slice_scatter_pad", "slice_scatter_mid"])
def test_slice_scatter_over_symbolic_ranges_is_generated_code(name):
    """A slice_scatter whose range ends at a size expression is a kernel, not ATen's op (on the H200 the
    serving stream ran it through ATen once per attention layer: a clone, a copy and a host call each)."""
    fn, make_args = CASES[name]
    cg = compile_symbolic(fn, *make_args(37))
    externs = [k.target for k in cg.loop_program.nodes if isinstance(k, ExternKernel)]  # type: ignore[attr-defined]
    assert not externs, externs


def conv_stride_pool(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (F.max_pool2d(F.conv2d(x, w, stride=2, padding=3).relu(), 3, 2, 1),
            F.adaptive_avg_pool2d(F.avg_pool2d(x, 3, 2, 1), 1))


@pytest.mark.parametrize("options", BACKENDS)
def test_strided_convolution_and_pools_over_image_sizes(options):
    """Height and width symbolic (the weight static): each output size ``(n + 2p - d*(k-1) - 1)//s + 1``
    divides ``n - 1``, computed as ``(n + 1)//2 - 1`` so C's division agrees; odd and even sizes."""
    def make_args(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(2, 3, n, n + 4), torch.randn(4, 3, 7, 7)
    cg = compile_symbolic(conv_stride_pool, *make_args(37), options=options, dynamic={0: (2, 3)})
    p = cg.loop_program  # type: ignore[attr-defined]
    assert len(p.sizes) == 2 and not assumed(p), p.as_text()
    check_sizes(cg, conv_stride_pool, make_args, (2, 3, 5, 11, 32, 33), atol=1e-4)


def two_dropouts(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a = F.dropout(x, 0.5, training=True)
    return a, F.dropout(x * 3, 0.25, training=True)


@pytest.mark.parametrize("options", BACKENDS)
def test_dropout_over_sizes_is_generated_code(options):
    """Dropout with a symbolic size is lowered (strict lowering: an ATen fallback fails the compile; it
    did fall back, "Cannot convert symbols to int", when the generator's offsets were Python ints): one
    graph serves every size, each call draws fresh masks, kept elements are scaled, the two dropouts draw
    from disjoint offset ranges (their masks differ), and the dropped fraction is about p."""
    cg = compile_symbolic(two_dropouts, torch.randn(37, 64), options=options)
    assert not assumed(cg.loop_program)  # type: ignore[attr-defined]
    for n in (37, 5, 200, 1):
        x = torch.randn(n, 64)
        a, b = cg.fn(x)
        a2, _ = cg.fn(x)
        assert a.shape == b.shape == (n, 64)
        torch.testing.assert_close(a[a != 0], (x * 2)[a != 0])
        torch.testing.assert_close(b[b != 0], (x * 4)[b != 0])
        if n >= 200:
            assert 0.45 < (a == 0).float().mean().item() < 0.55
            assert 0.2 < (b == 0).float().mean().item() < 0.3
            assert not torch.equal(a != 0, a2 != 0)  # a fresh seed per call
            assert (((a != 0) != (b != 0)).float().mean().item()) > 0.3  # independent streams


def batch_statistics(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    m = x.mean((0, 2, 3))
    return m, ((x - m[None, :, None, None]) ** 2).mean((0, 2, 3))


def test_reduction_over_two_ranges_vectorises_the_innermost_loop():
    """BatchNorm statistics over a symbolic batch reduce [s0, H*W] per channel: two reduction loops that
    cannot merge. ``omp simd`` sits on the innermost one; on the outer one g++ unrolled the inner
    1024-step loop whole and took minutes for one kernel file (a ResNet-18 training graph)."""
    cg = compile_symbolic(batch_statistics, torch.randn(4, 8, 32, 32), dynamic={0: (0,)})
    src = cg.texts["output_code"].split("# ---- kernels")[1]
    lines = [ln.strip() for ln in src.splitlines()]
    simd = [i for i, ln in enumerate(lines) if ln.startswith("#pragma omp simd reduction")]
    assert simd, src
    for i in simd:
        assert lines[i + 1].startswith("for (") and not lines[i + 2].startswith("for ("), "\n".join(lines[i - 2:i + 4])
    check_sizes(cg, batch_statistics, lambda n: (torch.randn(n, 8, 32, 32),), (4, 1, 3, 6), atol=1e-5)
