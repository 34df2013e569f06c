"""Automatic dynamic floats: a Python float that changed between calls (a resume function's
``loss.item()``, a learning-rate argument, a module attribute) is a symbolic float graph input from
the next capture on, instead of one graph per value until the recompile limit."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import kiln.capture as kc

from .conftest import assert_same


def item_then_print(x):
    s = x.sum().item()  # a graph break: the resume function receives the float
    print("", end="")
    return x * s + torch.tanh(x) / (s * s + 1.0)


def test_float_from_item_reaches_the_resume_function_symbolic(recorder):
    g = kc.optimize(item_then_print, recorder)
    for _ in range(10):
        x = torch.randn(6)
        assert_same(g(x), item_then_print(x))
    # the frame's graph (x.sum()), then the resume function: its first value, then one symbolic graph
    assert recorder.count <= 3
    resumes = list(g._kiln_context.resumes.values())
    assert len(resumes) == 1 and resumes[0].cache is not None and len(resumes[0].cache.entries) <= 2
    last = recorder.graphs[-1]
    assert any(isinstance(n.meta.get("val"), torch.SymFloat) for n in last.graph.nodes if n.op == "placeholder")


def step(x, lr: float):
    return x - lr * x.cos()


def test_float_argument_stream(recorder):
    g = kc.optimize(step, recorder)
    for i in range(10):
        x, lr = torch.randn(3, 4), 0.01 * (i + 1)
        assert_same(g(x, lr), step(x, lr))
    assert recorder.count <= 2


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.5
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_float_attribute_stream(recorder):
    m = Scaled()
    g = kc.optimize(m, recorder)
    for i in range(10):
        m.scale = 0.1 * i + 0.05
        x = torch.randn(2, 4)
        assert_same(g(x), m(x))
    assert recorder.count <= 2


def branchy(x, s: float):
    if s > 0.5:  # a decision on the value: a guard on the symbol, not a graph per value
        return x * s
    return x - math.sqrt(abs(s))


def test_decisions_on_a_symbolic_float_are_guarded(recorder):
    g = kc.optimize(branchy, recorder)
    values = [0.7, 0.9, 0.1, 2.5, -3.0, 0.6, 0.2, 0.51, -0.5, 4.0]
    for s in values:
        x = torch.randn(5)
        assert_same(g(x, s), branchy(x, s))
    assert recorder.count <= 4


def test_non_finite_floats_stay_correct(recorder):
    g = kc.optimize(step, recorder)
    for lr in (0.1, 0.2, float("nan"), 0.3, float("inf"), -0.25):
        x = torch.randn(3)
        torch.testing.assert_close(g(x, lr), step(x, lr), equal_nan=True)


def test_static_floats_with_dynamic_false(recorder):
    """dynamic=False keeps every float a constant of the graph (one graph per value)."""
    g = kc.optimize(step, recorder, dynamic=False)
    for lr in (0.1, 0.2, 0.3):
        x = torch.randn(3)
        assert_same(g(x, lr), step(x, lr))
    assert recorder.count == 3
    assert not any(isinstance(n.meta.get("val"), torch.SymFloat)
                   for gm in recorder.graphs for n in gm.graph.nodes)


@pytest.mark.parametrize("values", [(1.0, 1.0, 1.0), (2.0, 2.0, 3.0)])
def test_a_float_that_does_not_change_stays_a_constant(recorder, values):
    g = kc.optimize(step, recorder)
    for lr in values:
        x = torch.randn(3)
        assert_same(g(x, lr), step(x, lr))
    assert recorder.count == len(set(values))
    assert not any(isinstance(n.meta.get("val"), torch.SymFloat) for n in recorder.graphs[0].graph.nodes)
