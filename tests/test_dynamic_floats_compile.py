"""kiln.compile (inductor) on a stream of Python floats: a resume function fed ``x.sum().item()`` and
a learning-rate argument compile at most twice each and equal eager on fresh inputs every call."""

from __future__ import annotations

import pytest
import torch

import kiln


def item_then_print(x):
    s = x.sum().item()
    print("", end="")
    return x * s + torch.tanh(x) / (s * s + 1.0)


def step(x, lr: float):
    return x - lr * x.cos()


@pytest.mark.slow
def test_float_streams_compile_at_most_twice() -> None:
    kiln.reset()
    kiln.stats_reset()  # the counters are process-wide: other tests in this worker counted before
    f, g = kiln.compile(item_then_print), kiln.compile(step)
    for i in range(10):
        x = torch.randn(5, 3, requires_grad=True)
        torch.testing.assert_close(f(x), item_then_print(x))
        lr = 0.01 * (i + 1)
        torch.testing.assert_close(g(x, lr), step(x, lr))
        got = torch.autograd.grad(g(x, lr).sum(), x)[0]
        torch.testing.assert_close(got, torch.autograd.grad(step(x, lr).sum(), x)[0])
    # item_then_print: its graph, then the resume function twice; step: twice
    assert kiln.stats().graphs_captured <= 5
