"""Dynamic shapes on the GPU (run on the device machine): aot_eager over CUDA tensors with symbolic
sizes, forward and backward against eager, one compile for every size; the inductor backend's path
for symbolic graphs (generated kernels once kiln.inductor says SUPPORTS_SYMBOLIC_SHAPES, else the
logged ATen fallback), and bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
import kiln.capture as kc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class Block(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm, self.qkv, self.out, self.heads = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(y)
        return x + self.mlp(x)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_block_over_batch_and_sequence(backend: str, amp: bool) -> None:
    torch.manual_seed(0)
    m = Block().cuda()
    cf = kiln.compile(m, backend=backend, dynamic=True)
    for b, t in [(2, 17), (3, 64), (5, 129), (2, 17), (7, 33)]:
        x = torch.randn(b, t, 64, device="cuda", requires_grad=True)
        y = x.detach().clone().requires_grad_()
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            out, ref = cf(x), m(y)
        tol = dict(rtol=2e-2, atol=2e-2) if amp else dict(rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(out.float(), ref.float(), **tol)
        out.float().square().sum().backward()
        ref.float().square().sum().backward()
        torch.testing.assert_close(x.grad, y.grad, **tol)
    assert len(kc.cache_entries(cf._compiled_forward)) == 1
