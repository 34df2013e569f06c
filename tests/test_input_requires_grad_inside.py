"""``x.requires_grad_()`` inside compiled code on a tensor the caller passed: the caller's tensor gets
the flag and, after backward, its gradient, as in eager, call after call with fresh inputs. Before, the
flag changed only on the graph's copy: the output required grad, the caller's tensor did not, and its
``.grad`` stayed None after backward."""

from __future__ import annotations

import pytest
import torch

import kiln


def _flag_then_use(x):
    x.requires_grad_()
    return (x * 2).square().sum()


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_requires_grad_set_inside_reaches_the_callers_tensor(backend):
    kiln.reset()
    compiled = kiln.compile(_flag_then_use, backend=backend)
    for _ in range(3):
        x = torch.randn(4)
        ref = x.clone()
        got, want = compiled(x), _flag_then_use(ref)
        assert x.requires_grad and ref.requires_grad
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        assert x.grad is not None
        torch.testing.assert_close(x.grad, ref.grad)


def test_requires_grad_already_set_keeps_one_graph():
    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(_flag_then_use)
    x = torch.randn(4, requires_grad=True)
    compiled(x).backward()
    torch.testing.assert_close(x.grad, 8 * x.detach())
    assert kiln.stats().graph_breaks == 0
