"""kiln.inductor behind torch.compile(backend=...) on its own (torch-level graphs traced to ATen here)."""

from __future__ import annotations

import torch

from kiln.inductor import inductor_backend


def test_torch_compile_function_with_inplace_op() -> None:
    def f(x, w):
        y = torch.nn.functional.layer_norm(x, (16,), w)
        y += 1  # in-place on an intermediate: recorded as its functional form
        return torch.relu(y) * 2, y.sum()
    x, w = torch.randn(4, 16), torch.randn(16)
    cf = torch.compile(f, backend=inductor_backend)
    a, b = cf(x, w)
    ra, rb = f(x, w)
    torch.testing.assert_close(a, ra)
    torch.testing.assert_close(b, rb, atol=1e-4, rtol=1e-4)


def test_torch_compile_module_inference() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(4, 16)
    cm = torch.compile(m, backend=inductor_backend)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x))
