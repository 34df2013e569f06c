"""Rules whose ATen op has no CPU kernel, checked against autograd of the eager formula."""

from __future__ import annotations

import torch

from kiln.decomp import table

aten = torch.ops.aten


def test_fused_rms_norm_backward_matches_autograd():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 8, dtype=torch.float64)
    y = torch.nn.functional.rms_norm(x, [8], w, 1e-6)
    gx, gw = torch.autograd.grad(y, [x, w], g)
    tab = table("core_aten")
    _, rstd = tab[aten._fused_rms_norm.default](x.detach(), [8], w.detach(), 1e-6)
    got_x, got_w = tab[aten._fused_rms_norm_backward.default](g, x.detach(), [8], rstd, w.detach(), [True, True])
    torch.testing.assert_close(got_x, gx)
    torch.testing.assert_close(got_w, gw)
