"""A module updating its own buffer in the traced code (a call counter, an EMA): ``self.n += 1`` is an
in-place update of the same tensor, no graph break; ``self.n = self.n + 1`` rebinds the attribute to a
new tensor and still breaks. Fresh inputs every call; the buffers and outputs equal eager's."""

from __future__ import annotations

import torch
from torch import nn

import kiln.capture as kc

from .conftest import assert_same


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.lin(x)
        self.ema.mul_(0.9).add_(y.mean(0).detach(), alpha=0.1)
        return y * self.calls


class Rebinds(InPlace):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1
        return self.lin(x) * self.calls


def _run_both(cls: type, recorder, calls: int) -> nn.Module:
    """``calls`` calls of a compiled and an eager copy with fresh inputs: outputs and buffers equal."""
    torch.manual_seed(0)
    eager, compiled_model = cls(), cls()
    compiled_model.load_state_dict(eager.state_dict())
    g = kc.optimize(compiled_model, recorder)
    for n in range(calls):
        x = torch.randn(3, 4)
        assert_same(g(x), eager(x))
        assert compiled_model.calls.item() == eager.calls.item() == n + 1
        assert_same(compiled_model.ema, eager.ema)
    return compiled_model


def test_in_place_buffer_update_is_captured(recorder):
    compiled_model = _run_both(InPlace, recorder, 5)
    assert recorder.count == 1
    assert not kc.explain(compiled_model.forward)(torch.randn(3, 4)).break_reasons


def test_rebinding_a_buffer_still_breaks_and_stays_correct(recorder):
    _run_both(Rebinds, recorder, 4)
