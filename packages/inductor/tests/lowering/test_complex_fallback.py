"""Nodes that read or make complex tensors (NumPy's ``np.fft`` code traced as ``torch.fft``) run
through ATen inside the compiled graph: C++ and Triton kernels have no complex type. The real-valued
work around them still becomes generated kernels."""

from __future__ import annotations

import torch
from helpers import check, n_kernels

from kiln.inductor import InductorOptions


def spectrum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    f = torch.fft.rfft(x * 2.0 + 1.0)
    power = (f.abs() ** 2).sum(-1)
    return torch.fft.irfft(f * 0.5, n=x.shape[-1]).relu(), power.sqrt()


def test_complex_nodes_fall_back_and_match_eager() -> None:
    x = torch.randn(4, 16, dtype=torch.float64)
    cg = check(spectrum, x, options=InductorOptions(strict_lowering=False))
    assert n_kernels(cg) >= 1  # x * 2 + 1, relu, sqrt: still generated code


def test_complex_mul_of_a_complex_input() -> None:
    z = torch.randn(8, dtype=torch.complex64)
    check(lambda t: (t * 2).real + 1.0, z, options=InductorOptions(strict_lowering=False))
