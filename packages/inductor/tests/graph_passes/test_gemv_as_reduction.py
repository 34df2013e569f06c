"""One-row matmuls as fused reductions (graph_passes/gemv_as_reduction.py) on the Triton backend (the interpreter on CPU): the
result equals eager's and no matmul extern is left."""

from __future__ import annotations

import os

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
