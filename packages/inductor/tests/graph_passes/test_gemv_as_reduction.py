"""One-row matmuls as fused reductions (graph_passes/gemv_as_reduction.py) on the Triton backend (the interpreter on CPU): the
result equals eager's and no matmul extern is left."""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import check

from kiln.inductor import InductorOptions

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="Triton kernels need a GPU or TRITON_INTERPRET=1")


@pytest.mark.parametrize("bias", [True, False])
def test_one_row_linear_is_a_reduction(bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 64, generator=g), torch.randn(32, 64, generator=g)
    b = torch.randn(32, generator=g) if bias else None
    cg = check(lambda x, w, *b: (F.linear(x, w, *b).relu(),), x, w, *([b] if bias else []),
               options=InductorOptions(strict_lowering=True, cpu_backend="triton"))
    wrapper = cg.texts["output_code"].split("# ---- kernels ----")[0]
    assert not any(call in wrapper for call in ("torch.mm", "torch.addmm", "aten.mm", "aten.addmm")), wrapper


def test_a_vector_before_one_row_matmuls_is_computed_once() -> None:
    """A decode step's SwiGLU product, read by a one-row matmul rewritten as a reduction with 512 outputs: stored
    once, in the kernel that computes its inputs (the gate and up projections), not recomputed by every program of
    the reduction that reads it (every program re-read the gate and up outputs and evaluated the sigmoid again).
    The RMSNorm before the gate and up projections is the exception: its mean is a scalar that every program of
    their kernel computes itself from the vector it reads anyway (recompute_scalars.py), so the norm has no kernel
    of its own. The residual add is the down projection's epilogue."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 1, 512, generator=g), torch.randn(512, generator=g)
    wg, wu, wd = (torch.randn(512, 512, generator=g) / 16 for _ in range(3))

    def decode_mlp(x, w, wg, wu, wd):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return (x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd),)
    cg = check(decode_mlp, x, w, wg, wu, wd, atol=1e-4,
               options=InductorOptions(strict_lowering=True, cpu_backend="triton"))
    kernels = list({m.group(1): k for k in cg.texts["output_code"].split("@triton.jit")
                    if (m := re.match(r"\s*def (k\d+_\w*)", k))}.values())  # (the text holds each twice)
    with_sigmoid = [k for k in kernels if "sigmoid" in k]
    # the norm's mean (computed by every program again: recompute_scalars.py), gate, up, SwiGLU: one kernel
    assert len(with_sigmoid) == 1 and with_sigmoid[0].count("tl.sum") == 3, kernels
    assert sum("rsqrt" in k for k in kernels) == 1, kernels
    assert len(kernels) == 2, kernels
