"""``Tensor.set_`` and ``torch.ops.aten.set_`` on an input inside compiled code break the graph (the call
runs in Python) instead of an error at input write-back or a stale result; fresh inputs vs eager."""

from __future__ import annotations

import pytest
import torch

import kiln


def method(x, y):
    x.set_(y)
    return x * 2


def overload(x, y):
    torch.ops.aten.set_.source_Tensor(x, y)
    return x * 2


def packet(x, y):
    torch.ops.aten.set_(x, y)
    return x + 1


@pytest.mark.parametrize("fn", [method, overload, packet], ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_set_on_an_input_matches_eager(fn, backend):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(5)
        xe, ye = x.clone(), y.clone()
        out, want = compiled(x, y), fn(xe, ye)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x, xe)  # the input now has y's storage and shape, as in eager
        assert x.shape == xe.shape
    ex = kiln.explain(fn)(torch.randn(3), torch.randn(5))
    assert ex.break_count == 1 and "set_" in ex.break_reasons[0].reason, ex
