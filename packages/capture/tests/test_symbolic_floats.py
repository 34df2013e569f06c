"""Floats computed from symbolic sizes (``math.sqrt(d)``, ``float(n)``) stay symbolic: the graph
records them as torch's symbolic forms instead of specialising the size (a guard per size, then a
recompile for every new size)."""

from __future__ import annotations

import math

import pytest
import torch

import kiln.capture as kc

from .conftest import assert_same


@pytest.mark.parametrize("name", ["sqrt", "float", "sqrt_of_float"])
def test_float_of_a_symbolic_size_keeps_one_graph(recorder, name):
    fns = {
        "sqrt": lambda x: x / math.sqrt(x.shape[-1]),
        "float": lambda x: x * (1.0 / float(x.shape[-1])),
        "sqrt_of_float": lambda x: x * math.sqrt(float(x.shape[-1]) * 0.5),
    }
    f = fns[name]
    g = kc.optimize(f, recorder, dynamic=True)
    for n in (7, 2, 64, 5, 13):
        x = torch.randn(3, n)
        assert_same(g(x), f(x))
    assert recorder.count == 1
    placeholders = [n for n in recorder.graphs[0].graph.nodes if n.op == "placeholder"]
    assert any(isinstance(s, torch.SymInt) for s in placeholders[0].meta["val"].shape)


def test_math_sqrt_of_plain_numbers_and_tensors(recorder):
    """Plain numbers still compute in Python; a tensor argument (a data-dependent float) breaks the graph."""
    def f(x):
        return x * math.sqrt(2.0) + math.sqrt(x.shape[0])

    g = kc.optimize(f, recorder, dynamic=False)
    x = torch.randn(4)
    assert_same(g(x), f(x))

    def h(x):
        return x * math.sqrt(x.sum())

    gh = kc.optimize(h, recorder)
    y = torch.rand(4)
    assert_same(gh(y), h(y))
