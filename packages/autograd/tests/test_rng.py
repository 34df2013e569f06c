"""Random ops: the backward uses the forward's mask (random results are saved, never recomputed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ag_util import compile_fn  # type: ignore[import-not-found]

from kiln.autograd import ops


def _x() -> torch.Tensor:
    return torch.randn(64, 32, generator=torch.Generator().manual_seed(3)).requires_grad_()


@pytest.mark.parametrize("partitioner", ["min_cut", "save_all"])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_backward_uses_forward_mask(partitioner: str, p: float) -> None:
    x = _x()
    c = compile_fn(lambda x: (F.dropout(x, p, True) * 3.0,), [x], partitioner=partitioner)
    (y,) = c(x)
    y.backward(torch.ones_like(y))
    mask = (y != 0).float()
    torch.testing.assert_close(x.grad, mask * 3.0 / (1 - p))
    assert 0 < mask.mean().item() < 1


@pytest.mark.parametrize("partitioner", ["min_cut", "save_all"])
def test_dropout_then_pointwise_chain(partitioner: str) -> None:
    x = _x()
    c = compile_fn(lambda x: (torch.tanh(F.dropout(torch.sin(x), 0.3, True)).sum(),), [x],
                   partitioner=partitioner)
    torch.manual_seed(7)
    (y,) = c(x)
    y.backward()
    torch.manual_seed(7)
    x2 = x.detach().clone().requires_grad_()
    y2 = torch.tanh(F.dropout(torch.sin(x2), 0.3, True)).sum()
    y2.backward()
    torch.testing.assert_close(y, y2)  # same seed, same generator calls: same mask as eager
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize("make", [
    lambda x: x * torch.rand_like(x),
    lambda x: x + torch.randn_like(x),
    lambda x: x * torch.bernoulli(torch.full_like(x, 0.5)),
    lambda x: x * torch.empty_like(x).uniform_(0, 1),
    lambda x: x * torch.empty_like(x).normal_(),
])
def test_random_values_saved_not_recomputed(make) -> None:  # type: ignore[no-untyped-def]
    x = _x()
    c = compile_fn(lambda x: (make(x).exp().sum(), make(x)), [x])
    parts = c.aot.partitioned
    for n in parts.bw_gm.graph.nodes:
        assert not ops.is_random(n.target), f"backward recomputes random op {n.target}"
    torch.manual_seed(0)
    out, _ = c(x)
    out.backward()
    assert torch.isfinite(x.grad).all()


def test_dropout_eval_mode_is_identity() -> None:
    x = _x()
    c = compile_fn(lambda x: (F.dropout(x, 0.5, False),), [x])
    (y,) = c(x)
    torch.testing.assert_close(y, x)


def test_different_masks_each_call() -> None:
    x = _x()
    c = compile_fn(lambda x: (F.dropout(x, 0.5, True),), [x])
    a, b = c(x)[0], c(x)[0]
    assert not torch.equal(a, b)
