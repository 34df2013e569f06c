"""Scheduler passes on small programs: groups, roles, stages, stores and memory plans."""

from __future__ import annotations

import torch
from helpers import compile_fn

from kiln.inductor import Kernel


def _kernels(cg) -> list[Kernel]:
    return cg.scheduled.kernels()


def test_softmax_row_kernel_stages() -> None:
    cg = compile_fn(lambda x: torch.softmax(x, -1), torch.randn(4, 8, 16))
    (k,) = _kernels(cg)
    assert k.outer == (32,) and k.inner == (16,)  # [4, 8] merged into one parallel loop
    stages = {kn.buffer: (kn.role, kn.kind, kn.stage, kn.store) for kn in k.nodes}
    roles = sorted(v[:3] for v in stages.values())
    assert roles == [("full", "pointwise", 2), ("outer", "reduction", 0), ("outer", "reduction", 1)]
    assert [v[3] for v in stages.values()].count(True) == 1  # only the output is stored


def test_contiguous_pointwise_collapses_to_one_loop() -> None:
    cg = compile_fn(lambda x: x.sin() + 1, torch.randn(3, 5, 7))
    (k,) = _kernels(cg)
    assert k.outer == (105,) and k.inner == ()


def test_broadcast_blocks_merging_of_its_dims() -> None:
    cg = compile_fn(lambda x, b: x + b, torch.randn(6, 10), torch.randn(10))
    (k,) = _kernels(cg)
    assert k.outer == (6, 10)


def test_post_fusion_text_lists_kernels_and_steps() -> None:
    cg = compile_fn(lambda x: (x.exp().sum(-1) + 1, x.cos()), torch.randn(4, 8))
    text = cg.texts["ir_post_fusion"]
    assert "kernel k0_" in text and "alloc" in text and "reduction_sum" in text


def test_strided_reduction_is_tiled_over_the_contiguous_dim() -> None:
    from helpers import check
    x = torch.randn(64, 40)
    cg = check(lambda x: (x.sum(0), x.amax(0), x.var(0)), x, atol=1e-4)
    code = cg.texts["output_code"]
    assert "xt += 16" in code  # vectorised across a tile of columns, not along the strided rows


def test_an_epilogue_over_the_reduction_rows_with_size_one_dims_joins_its_kernel() -> None:
    """A pointwise over [4, 1, 8] reading a reduction over [4, 8 | 16] (the same rows up to a size-1 dim: a
    model's [batch, seq=1, features] around a one-row matmul's [1, features]) is the reduction kernel's
    epilogue: one kernel, and only the epilogue's result stored."""
    from helpers import check

    def fn(x, y):
        s = x.sum(-1)  # [4, 8]
        return (torch.sigmoid(s.view(4, 1, 8)) * y,)
    cg = check(fn, torch.randn(4, 8, 16), torch.randn(4, 1, 8))
    (k,) = _kernels(cg)
    assert [kn.store for kn in k.nodes].count(True) == 1
