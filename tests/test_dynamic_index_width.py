"""The 32-bit index guard of symbolic Triton kernels through kiln.compile (kiln.inductor's
index_width.py): the capture checks it before every call, so a size past it recompiles (here at a
small ``index32_limit``; by default 2**30 elements) instead of indexing past 32 bits; every call,
with fresh inputs, equals eager."""

from __future__ import annotations

import os

import pytest
import torch

import kiln

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1")


def _scale_relu_sums(x, w):
    y = torch.relu(x * w[None, :, None, None] + 1)
    return y, y.sum((0, 2, 3))


def test_a_size_past_the_index_guard_recompiles_and_stays_right():
    kiln.reset()
    kiln.stats_reset()
    cf = kiln.compile(_scale_relu_sums, dynamic=True, options={"cpu_backend": "triton", "index32_limit": 4096})
    for n in (2, 3, 5, 9, 12, 3, 14, 2):  # 9: 3888 elements (inside); 12: 6075 (past the guard)
        g = torch.Generator().manual_seed(n)
        x, w = torch.randn(n, 3, n + 3, n + 3, generator=g), torch.randn(3, generator=g)
        for got, want in zip(cf(x, w), _scale_relu_sums(x, w), strict=True):
            torch.testing.assert_close(got, want)
    s = kiln.stats()
    assert s.graphs_compiled == 2 and s.recompiles == 1, s
