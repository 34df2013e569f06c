"""Scalars out of compiled NumPy code, through kiln.autograd and kiln.inductor: NumPy scalars (``np.sum(a)``,
``a.mean()``, ``np.float64`` arithmetic), Python numbers made by a data-dependent ``float()``/``.item()``
after the graph breaks there (the last graph then returns a symbolic float: the sum of two float arguments,
computed again from each call's arguments, never the first call's value), and symbolic sizes returned as
ints. Each is called 3 times with fresh inputs against eager, with graph and break counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln

pytestmark = pytest.mark.xdist_group("tests/test_numpy_scalar_outputs.py")

# name: (program, graphs, breaks)
P = {
    "np_sum": (lambda a: np.sum(a), 1, 0),
    "mean_method": (lambda a: a.mean(), 1, 0),
    "float64_arithmetic": (lambda a: np.float64(2.5) * a.sum() + np.float64(1.0), 1, 0),
    "float64_of_array": (lambda a: (np.float64(a.sum()) * 2, np.float32(a.mean())), 1, 0),
    "float_plus_item": (lambda a: float(a.sum()) + a.mean().item(), 2, 2),
    "float_arithmetic": (lambda a: float(a.sum()) * 2 + 1, 1, 1),
    "item_returned": (lambda a: a.max().item(), 1, 1),
    "int_of_argmax": (lambda a: int(a.argmax()) + a.shape[0], 1, 1),
    "mixed_tuple": (lambda a: (a.sum(), a.mean().item(), a.std()), 2, 1),
    "percentile_median": (lambda a: (np.percentile(a, [10, 90], axis=0), np.median(a), np.quantile(a, 0.3, axis=1)),
                          1, 0),
}


def _same(got, want):
    if isinstance(want, tuple):
        assert type(got) is tuple and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(P))
def test_scalar_outputs_on_fresh_inputs(name, backend):
    fn, graphs, breaks = P[name]
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    outs = []
    for i in range(3):
        a = np.random.default_rng(300 + i).standard_normal((4, 4))
        got = compiled(a.copy())
        _same(got, fn(a.copy()))
        outs.append(got)
    assert not np.allclose(np.asarray(outs[0][0] if isinstance(outs[0], tuple) else outs[0], dtype=float),
                           np.asarray(outs[1][0] if isinstance(outs[1], tuple) else outs[1], dtype=float))
    e = kiln.explain(fn)(a)
    assert (e.graph_count, e.break_count) == (graphs, breaks)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_symbolic_size_returned_as_an_int(backend):
    def f(x):
        return x * 2, x.shape[0] * 3 + 1
    kiln.reset()
    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 2)
        got = compiled(x)
        assert type(got[1]) is int and got[1] == 3 * n + 1
        torch.testing.assert_close(got[0], x * 2)


def test_torch_quantile_of_everything_through_inductor():
    """A gather with a 0-d result read x[0] instead of x at the index (torch.quantile(x, 0.5) was wrong)."""
    def f(x):
        return torch.quantile(x, 0.5), torch.gather(x.reshape(-1), 0, (x.sum() > 0).long() + 3)
    kiln.reset()
    compiled = kiln.compile(f, backend="inductor")
    for i in range(3):
        x = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        for g, w in zip(compiled(x), f(x)):
            torch.testing.assert_close(g, w)


def test_torch_quantile_over_an_axis_through_inductor():
    """torch.quantile's lerp_ then unsqueeze_/transpose_/squeeze_ on the gather's own tensor left the gather node
    with the final (2, 4) value instead of its (4, 2): kiln.inductor read the wrong elements."""
    q = torch.tensor([0.1, 0.9], dtype=torch.float64)

    def f(x):
        return torch.quantile(x, q, dim=0)
    kiln.reset()
    compiled = kiln.compile(f, backend="inductor")
    for i in range(3):
        x = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(compiled(x), f(x))
