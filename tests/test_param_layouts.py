"""kiln.compile end to end (generated C++ that bakes sizes and strides) on a model whose parameters
are relaid out in place after the compile: it recompiles, never runs the old code on them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln


@pytest.mark.slow
def test_compiled_linear_after_set_data_and_unfreeze() -> None:
    kiln.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    m[2].weight.requires_grad_(False)
    opt = kiln.compile(m)

    def same_as_eager() -> None:
        for _ in range(2):
            x = torch.randn(5, 4)
            m.zero_grad(set_to_none=True)
            got = opt(x)
            got.sum().backward()
            got_grads = [None if p.grad is None else p.grad.clone() for p in m.parameters()]
            m.zero_grad(set_to_none=True)
            want = m(x)
            want.sum().backward()
            torch.testing.assert_close(got, want)
            for g, p in zip(got_grads, m.parameters()):
                torch.testing.assert_close(g, p.grad)

    same_as_eager()
    m[0].weight.data = m[0].weight.data.t().contiguous().t()  # column-major: wrong values before
    same_as_eager()
    m[2].weight.requires_grad_(True)  # unfrozen: its gradient was None before
    same_as_eager()


@pytest.mark.slow
def test_compiled_model_after_swap_tensors() -> None:
    """``torch.utils.swap_tensors`` on a compiled model's parameters (it refused before: "has weakref"):
    the compiled code runs with the swapped-in tensors, values and gradients equal eager's on fresh
    inputs; a swap to another shape recompiles."""
    kiln.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    opt = kiln.compile(m)

    def same_as_eager() -> None:
        for _ in range(2):
            x = torch.randn(5, 4)
            m.zero_grad(set_to_none=True)
            got = opt(x)
            got.sum().backward()
            got_grads = [p.grad.clone() for p in m.parameters()]
            m.zero_grad(set_to_none=True)
            want = m(x)
            want.sum().backward()
            torch.testing.assert_close(got, want)
            for g, p in zip(got_grads, m.parameters()):
                torch.testing.assert_close(g, p.grad)

    same_as_eager()
    for _ in range(2):
        torch.utils.swap_tensors(m[0].weight, nn.Parameter(torch.randn(3, 4)))
        same_as_eager()
    torch.utils.swap_tensors(m[0].weight, nn.Parameter(torch.randn(6, 4)))
    torch.utils.swap_tensors(m[0].bias, nn.Parameter(torch.randn(6)))
    torch.utils.swap_tensors(m[2].weight, nn.Parameter(torch.randn(2, 6)))
    same_as_eager()
