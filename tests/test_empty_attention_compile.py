"""kiln.compile(dynamic=True) of a block with causal and masked attention, called with fresh inputs at
sequence lengths 0, 1, 5, 0, 7 and a batch of 0, forward and backward, against eager, on the Python
wrapper and wrapper="cpp" (its inference graphs). Runs in a child process: ATen's CPU flash attention
kills the process (SIGFPE) on an empty sequence, and a regression must fail the test, not pytest
(kiln.inductor's wrappers branch around the kernel: packages/inductor/tests/dynamic/test_empty_attention.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

D, H = 16, 2


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.out = torch.nn.Linear(D, D)

    def forward(self, x, m):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in self.qkv(x).split(D, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) + F.scaled_dot_product_attention(q, k, v,
                                                                                                       attn_mask=m)
        return self.out(y.transpose(1, 2).reshape(b, t, D)).relu()


def run(wrapper: str) -> None:
    import kiln

    torch.manual_seed(0)
    model = Block()
    opts = {} if wrapper == "python" else {"options": {"wrapper": "cpp"}}
    compiled = kiln.compile(model, dynamic=True, **opts)
    for b, t in ((1, 3), (1, 0), (2, 1), (1, 5), (2, 0), (1, 7), (0, 4)):
        x, m = torch.randn(b, t, D), torch.randn(t, t)
        kiln.mark_dynamic(x, [0, 1])
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, m), model(x, m), atol=1e-5, rtol=1e-4)
        xg = x.clone().requires_grad_()
        out, ref = compiled(xg, m), model(x.clone().requires_grad_(), m)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        got = torch.autograd.grad(out.square().sum(), (xg, *model.parameters()))
        xr = x.clone().requires_grad_()
        want = torch.autograd.grad(model(xr, m).square().sum(), (xr, *model.parameters()))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=lambda s, b=b, t=t: f"({b}, {t}): {s}")


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["python", "cpp"])
def test_attention_at_empty_sizes_matches_eager(wrapper):
    r = subprocess.run([sys.executable, __file__, wrapper], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit status {r.returncode} (-8: SIGFPE)\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


if __name__ == "__main__":
    run(sys.argv[1])
