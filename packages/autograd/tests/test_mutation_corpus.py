"""A corpus of small programs mutating intermediates, inputs and views of both, in place.

Every program runs eagerly and through kiln.autograd (training and inference); outputs, inputs after
the call (write-back of input mutations) and gradients must match.
"""

from __future__ import annotations

import pytest
import torch
from ag_util import check  # type: ignore[import-not-found]

VIEWS = {
    "whole": lambda h: h,
    "row": lambda h: h[0],
    "cols": lambda h: h[:, 1:3],
    "t": lambda h: h.t(),
    "flat": lambda h: h.view(-1),
    "diag": lambda h: h.diagonal(),
    "unbind": lambda h: h.unbind(0)[1],
    "split": lambda h: h.split(2, dim=1)[1],
    "narrow": lambda h: h.narrow(1, 1, 2),
    "strided": lambda h: h[1:, ::2],
    "t_row": lambda h: h.transpose(0, 1)[1],
    "unsq": lambda h: h.unsqueeze(0),
    "as_strided": lambda h: h.as_strided((2, 2), (1, 4)),
    "select_col": lambda h: h.select(1, 2),
    "chain": lambda h: h[1:].t()[0],
}

OPS = {
    "add_": lambda v: v.add_(1.5),
    "mul_": lambda v: v.mul_(2.0),
    "zero_": lambda v: v.zero_(),
    "clamp_": lambda v: v.clamp_(min=-0.1, max=0.3),
    "copy_": lambda v: v.copy_(torch.full_like(v, 3.0)),
    "masked_fill_": lambda v: v.masked_fill_(v > 0, -1.0),
}


def _inputs(requires_grad: bool = True) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g).requires_grad_(requires_grad)]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("view", list(VIEWS))
def test_mutate_intermediate_view(view: str, op: str) -> None:
    def f(x, w):
        h = x * w + 0.5
        OPS[op](VIEWS[view](h))
        return (h * h).sum(0), h.relu()
    check(f, _inputs())


@pytest.mark.parametrize("op", ["add_", "copy_", "masked_fill_"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_mutate_input_view(view: str, op: str) -> None:
    def f(x, w):
        OPS[op](VIEWS[view](x))
        return (x * w).sum(1)
    check(f, _inputs())


@pytest.mark.parametrize("view", ["whole", "row", "t", "diag", "split", "as_strided"])
def test_mutate_input_view_inference(view: str) -> None:
    def f(x, w):
        VIEWS[view](x).mul_(3.0)
        return x + w
    check(f, _inputs(requires_grad=False), no_grad=True)
