"""Symbolic numbers passed where an ATen schema takes a plain one (``torch.linspace``'s ``steps``,
``scaled_dot_product_attention``'s ``scale``) are traced as torch code (size_polyfills.py): one
symbolic graph serves every size instead of a recompile per size, and results equal eager's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln.capture as kc

from .conftest import assert_same

SIZES = (4, 7, 9, 12, 33, 17, 2, 64)

PATTERNS = {
    "linspace_steps": (lambda x: x * torch.linspace(0, 1, x.shape[0]), lambda n: torch.randn(n)),
    "linspace_to_n": (lambda x: x + torch.linspace(0, x.shape[0], steps=x.shape[0]), lambda n: torch.randn(n)),
    "linspace_float64": (lambda x: x + torch.linspace(-2.5, 3.0, x.shape[0], dtype=torch.float64),
                         lambda n: torch.randn(n, dtype=torch.float64)),
    "linspace_keywords": (lambda x: x + torch.linspace(start=1.5, end=-1.0, steps=x.shape[-1], device=x.device),
                          lambda n: torch.randn(3, n)),
    "linspace_symbolic_end": (lambda x: x[:5] * torch.linspace(0.5, x.shape[0], 5), lambda n: torch.randn(n + 5)),
    "sdpa_scale_head_dim": (lambda q: F.scaled_dot_product_attention(q, q * 2, q + 1, scale=1 / math.sqrt(q.shape[-1])),
                            lambda n: torch.randn(2, 3, 5, n)),
    "sdpa_scale_seq_len": (lambda q: F.scaled_dot_product_attention(q, q.flip(2), q + 1, is_causal=True,
                                                                     scale=0.5 / math.sqrt(q.shape[-2])),
                           lambda n: torch.randn(2, 3, n, 8)),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_symbolic_number_argument_compiles_twice(recorder, name):
    fn, make = PATTERNS[name]
    g = kc.optimize(fn, recorder)
    for n in SIZES:
        x = make(n)
        assert_same(g(x), fn(x))
    assert recorder.count == 2  # the first size, then one symbolic graph for every other size
    placeholders = [n for n in recorder.graphs[-1].graph.nodes if n.op == "placeholder"]
    assert any(isinstance(s, torch.SymInt) for p in placeholders
               for s in getattr(p.meta.get("val"), "shape", ()))


def test_linspace_of_one_and_zero_steps(recorder):
    """Steps that may be 0 or 1 (a size minus one): ATen's special cases, kept by guards, never a division
    by zero."""
    def f(x):
        return torch.linspace(2.0, 3.0, x.shape[0] - 1)
    g = kc.optimize(f, recorder, dynamic=True)
    for n in (1, 2, 3, 9, 2, 1, 17):
        assert_same(g(torch.randn(n)), f(torch.randn(n)))


def test_constant_arguments_are_recorded_as_the_call(recorder):
    """Only a symbolic argument takes the polyfill: a constant linspace is still one node."""
    def f(x):
        return x * torch.linspace(0, 1, 5)
    g = kc.optimize(f, recorder)
    x = torch.randn(5)
    assert_same(g(x), f(x))
    assert [n.target for n in recorder.graphs[0].graph.nodes if n.op == "call_function"][0] is torch.linspace


DERIVED = {
    "ceil": lambda x: x[: math.ceil(x.shape[0] / 3)] * 2,
    "floor": lambda x: x[: math.floor(x.shape[0] / 3)] * 2,
    "round": lambda x: x[: round(x.shape[0] / 3)] * 2,
    "int_of_float": lambda x: x[: int(x.shape[0] * 0.5)] * 2,
    "min_of_sizes": lambda x: x[: min(x.shape[0] - 1, 2 * x.shape[0] // 3)] + 1,
}


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_size_derived_through_python_math_slices_correctly(recorder, name):
    """``x[:math.ceil(n / 3)]``: the bound is computed in the graph for every size (it was a graph break
    whose slice kept the first symbolic size's bound: a wrong shape for every later size), and
    ``int(n * 0.5)`` truncates symbolically instead of pinning the size."""
    fn = DERIVED[name]
    g = kc.optimize(fn, recorder)
    for n in (8, 12, 16, 20, 23, 40, 12):
        x = torch.randn(n)
        assert_same(g(x), fn(x))
    assert recorder.count == 2
