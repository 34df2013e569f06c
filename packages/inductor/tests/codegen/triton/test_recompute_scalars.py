"""Scalar reductions recomputed by the reductions that read them (recompute_scalars.py): decode's RMSNorm
statistic computed inside the one-row matmuls after it (gemv_as_reduction.py) instead of in a kernel of
its own. Compared with eager over several calls with fresh inputs; the launches are counted with the
pass on and off. Under the interpreter on CPU here, on the GPU there (conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device

ON = InductorOptions(cpu_backend="triton")
OFF = InductorOptions(cpu_backend="triton", recompute_scalars=False)


def _rand(seed: int, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device(), dtype=dtype)


def _rms(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h32 = h.float()
    return (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype) * w


def _layer(x: torch.Tensor, res: torch.Tensor, wn: torch.Tensor, wq: torch.Tensor, w1: torch.Tensor,
           w3: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # the norm before q (read by one matmul) and before the MLP (read by two: stored, then inlined)
    q = F.linear(_rms(x, wn), wq)
    n = _rms(x + res, wn)
    return q, F.silu(F.linear(n, w1)) * F.linear(n, w3)


def _one_element_kernels(cg) -> int:
    layouts = cg.scheduled.program.layouts()
    return sum(all(int(layouts[b].shape[j]) == 1 for j in range(len(layouts[b].shape)))
               for k in cg.scheduled.launched() for b in k.outputs)


@pytest.mark.parametrize(("k", "dtype"), [(64, torch.float32), (96, torch.bfloat16), (3000, torch.float32)])
def test_rmsnorm_statistic_computed_in_the_matmuls_that_read_it(k: int, dtype: torch.dtype) -> None:
    n = 48
    shapes = [(1, k), (1, k), (k,), (n, k), (2 * n, k), (2 * n, k)]
    args = [_rand(i, *s, dtype=dtype) for i, s in enumerate(shapes)]
    on = compile_graph(trace(_layer, *args), args, options=ON)
    off = compile_graph(trace(_layer, *args), args, options=OFF)
    # off: a kernel writes the statistics (both norms' in one here), on: one kernel per norm and its matmuls
    assert _one_element_kernels(off) >= 1 and _one_element_kernels(on) == 0
    assert len(on.scheduled.launched()) == 2 < len(off.scheduled.launched())
    rel = 1e-4 if dtype == torch.float32 else 2e-2
    for call in range(3):
        fresh = [_rand(10 * call + i + 7, *s, dtype=dtype) * (call + 1) for i, s in enumerate(shapes)]
        got, unfused = on.fn(*fresh), off.fn(*fresh)
        for g, u, want in zip(got, unfused, _layer(*fresh)):
            # eager's matmul sums in another order: relative to the largest value (SiLU * up grows it)
            scale = float(want.abs().max())
            torch.testing.assert_close(g.float(), want.float(), atol=rel * scale, rtol=rel)
            torch.testing.assert_close(g, u, atol=1e-6 * scale, rtol=1e-6)  # the same sums as unfused


def test_a_statistic_over_another_range_keeps_its_kernel() -> None:
    # the scalar reduces 64 elements, the matmul 32: not the same range, nothing recomputed
    def f(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.linear(y * torch.rsqrt(x.pow(2).mean()), w),)

    args = [_rand(0, 1, 64, dtype=torch.float32), _rand(1, 1, 32, dtype=torch.float32),
            _rand(2, 16, 32, dtype=torch.float32)]
    cg = compile_graph(trace(f, *args), args, options=ON)
    assert _one_element_kernels(cg) == 1
    torch.testing.assert_close(cg.fn(*args)[0], f(*args)[0], atol=1e-4, rtol=1e-4)


def test_an_abs_max_scale_over_a_vector_is_computed_in_the_matmul() -> None:
    # ``x.abs().max()`` of a [1, K] vector reduces [1, K] (a size-1 dim besides K): computed in the matmul's kernel
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.linear(x / x.abs().max(), w),)

    shapes = [(1, 96), (40, 96)]
    args = [_rand(i, *s, dtype=torch.float32) for i, s in enumerate(shapes)]
    on = compile_graph(trace(f, *args), args, options=ON)
    off = compile_graph(trace(f, *args), args, options=OFF)
    assert _one_element_kernels(on) == 0 and len(on.scheduled.launched()) < len(off.scheduled.launched())
    for call in range(3):
        fresh = [_rand(20 + 2 * call + i, *s, dtype=torch.float32) for i, s in enumerate(shapes)]
        fresh[0][0, call] = 50.0 * (-1) ** call  # the largest magnitude moves, with either sign
        torch.testing.assert_close(on.fn(*fresh)[0], f(*fresh)[0], atol=1e-5, rtol=1e-5)
