"""A KV cache written with ``index_copy_`` (HF's StaticCache, a decode step) runs as one generated kernel that
stores the new positions straight into the caller's cache: no copy of the cache, no ATen ``index_put_``, the
new values computed inside the same kernel. Checked over many calls with fresh positions and values
against eager (the caller's cache equal to eager's after every call), on the C++ backend and on the Triton
path (interpreter); a position out of range raises as eager does (C++)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln


class Cache(nn.Module):
    def __init__(self, length: int = 16) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 4, length, 8))
        self.register_buffer("v", torch.zeros(1, 4, length, 8))

    def forward(self, kv: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k.index_copy_(2, pos, kv * 2)
        self.v.index_copy_(2, pos, kv.sin())
        return F.scaled_dot_product_attention(kv, self.k, self.v)


TRITON = pytest.param({"cpu_backend": "triton"}, id="triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1"))


@pytest.mark.parametrize("options", [pytest.param({}, id="cpp"), TRITON])
def test_cache_positions_are_stored_in_place_by_one_kernel(options, stage_texts):
    kiln.reset()
    torch.manual_seed(0)
    model, ref = Cache(), Cache()
    compiled = kiln.compile(model, options=options)
    with stage_texts("output_code") as texts:
        for p in torch.randperm(16)[:10].tolist():  # fresh positions and values every call
            kv, pos = torch.randn(1, 4, 1, 8), torch.tensor([p])
            torch.testing.assert_close(compiled(kv, pos), ref(kv, pos))
            torch.testing.assert_close(model.k, ref.k)
            torch.testing.assert_close(model.v, ref.v)
    (code,) = (t.text for t in texts)
    assert "index_put_.default" not in code  # no ATen fallback
    assert "_init(" not in code and "_init =" not in code  # (Triton: a scatter's copy of its base is a launch, ``k*_init``)
    # both caches' new values bound to the caller's tensors (Triton: both writes in one kernel group's launch,
    # whose comment names both)
    assert code.count("reuse: ") >= 2, code


def test_a_position_out_of_range_raises_and_writes_nothing_outside_the_cache():
    """Eager checks before it writes; a kernel finds the bad index while it stores, so the failed call may
    have written its values at position 0 (never outside the tensor); every other position is as it was."""
    kiln.reset()
    model, ref = Cache(12), Cache(12)  # (another graph than the test above: its generated code is not cached)
    compiled = kiln.compile(model)
    kv = torch.randn(1, 4, 1, 8)
    compiled(kv, torch.tensor([3]))
    ref(kv, torch.tensor([3]))
    with pytest.raises(IndexError):
        ref(kv, torch.tensor([12]))
    with pytest.raises(IndexError, match="index 12 is out of bounds"):
        compiled(kv, torch.tensor([12]))
    torch.testing.assert_close(model.k[:, :, 1:], ref.k[:, :, 1:])  # (an out-of-range store goes to row 0)
    compiled(kv, torch.tensor([5]))
    ref(kv, torch.tensor([5]))
    torch.testing.assert_close(model.k[:, :, 1:], ref.k[:, :, 1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_cache_positions_are_stored_in_place_on_the_gpu(mode, stage_texts):
    """The same on CUDA tensors (Triton), in default mode and under CUDA graphs (the cache an input the
    graph writes: recorded at the caller's own address)."""
    kiln.reset()
    torch.manual_seed(0)
    model, ref = Cache().cuda(), Cache().cuda()
    compiled = kiln.compile(model, mode=mode)
    with stage_texts("output_code") as texts:
        for p in torch.randperm(16)[:10].tolist():
            kv, pos = torch.randn(1, 4, 1, 8, device="cuda"), torch.tensor([p], device="cuda")
            torch.testing.assert_close(compiled(kv, pos), ref(kv, pos))
            torch.testing.assert_close(model.k, ref.k)
            torch.testing.assert_close(model.v, ref.v)
    assert texts and all("index_put_.default" not in t.text for t in texts)
