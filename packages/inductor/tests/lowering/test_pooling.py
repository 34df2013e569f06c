"""max_pool2d lowered as an unrolled window max (inference), checked against eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import check, n_kernels

from kiln.inductor import InductorOptions


def test_max_pool2d_is_lowered_and_fused() -> None:
    cases = [((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
             ((1, 2, 8, 7), dict(kernel_size=2)),
             ((2, 4, 10, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
             ((3, 10, 10), dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), dilation=(2, 1)))]
    for shape, kw in cases:
        x = torch.randn(shape)
        x.view(-1)[5] = float("nan")  # NaN in a window wins, as in ATen
        cg = check(lambda t, kw=kw: F.max_pool2d(t.relu() * 2, **kw), x)
        assert "fallbacks" not in cg.texts, cg.texts.get("fallbacks")
        assert n_kernels(cg) == 1


def test_max_pool2d_with_used_indices_falls_back_loudly() -> None:
    x = torch.randn(1, 2, 8, 8)
    cg = check(lambda t: F.max_pool2d(t, 2, return_indices=True), x,
               options=InductorOptions(strict_lowering=False))
    assert "max_pool2d" in cg.texts["fallbacks"]


def test_bf16_max_pool_is_computed_in_fp32() -> None:
    x = torch.randn(2, 3, 8, 8).to(torch.bfloat16)
    cg = check(lambda t: F.max_pool2d(t, 3, 2, 1), x)
    assert "fallbacks" not in cg.texts
