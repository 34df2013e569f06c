"""Module containers that change between calls, and recurrent modules trained inside compiled code,
called again and again against eager.

Before: a layer appended to an ``nn.ModuleList`` after the first call was never run (iterating the list
read its length once, unguarded), and the training step of an ``nn.LSTM``/``nn.GRU`` on the CPU failed
in its backward (aot_eager: "Expected a proper Tensor but got None for argument 'workspace'") or crashed
the process (inductor: a segmentation fault in the compiled backward)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln

BACKENDS = ["aot_eager", "inductor"]


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x + self.layers[-1].bias


class _Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2)})

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads.values()], dim=-1) + len(self.heads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [_Stack, _Heads], ids=["ModuleList", "ModuleDict"])
def test_members_added_after_a_call_are_run(backend, make):
    kiln.reset()
    torch.manual_seed(0)
    m = make()
    compiled = kiln.compile(m, backend=backend)
    for i in range(4):
        if i:
            torch.manual_seed(i)
            if isinstance(m, _Stack):
                m.layers.append(nn.Linear(4, 4))
            else:
                m.heads[f"h{i}"] = nn.Linear(4, 3)
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), m(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_recurrent_module_trains_as_in_eager(backend, kind):
    def make():
        torch.manual_seed(0)
        cls = nn.LSTM if kind == "LSTM" else nn.GRU
        return cls(4, 5, num_layers=2, batch_first=True, bidirectional=kind == "GRU")

    kiln.reset()
    ref, mine = make(), make()
    compiled = kiln.compile(mine, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 3, 4)
        got, want = compiled(x)[0], ref(x)[0]
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        for a, b in zip(mine.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
        mine.zero_grad()
        ref.zero_grad()


def test_a_recurrent_module_in_inference_is_compiled():
    kiln.reset()
    kiln.stats_reset()
    torch.manual_seed(0)
    m = nn.LSTM(4, 5, batch_first=True).eval()
    compiled = kiln.compile(m)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 4)
            torch.testing.assert_close(compiled(x)[0], m(x)[0])
    assert kiln.stats().graphs_compiled >= 1 and kiln.stats().graph_breaks == 0, kiln.stats()
