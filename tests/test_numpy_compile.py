"""NumPy functions through kiln.compile with the inductor backend: one graph, generated code,
NumPy's results (values, float64 dtypes, ndarray/scalar types) on every call with fresh data."""

import numpy as np
import pytest

import kiln


def softmax_plus(a, b):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True) + np.sin(b) * 2.0


def kmeans_step(points, centers):
    d = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    nearest = d.argmin(axis=1)
    onehot = (nearest[:, None] == np.arange(centers.shape[0])[None, :]).astype(np.float64)
    counts = onehot.sum(axis=0)[:, None]
    return (onehot.T @ points) / np.maximum(counts, 1.0), d.min(axis=1).sum()


@pytest.mark.parametrize("fn, make", [
    (softmax_plus, lambda rng: (rng.standard_normal((16, 32)), rng.standard_normal((16, 32)))),
    (kmeans_step, lambda rng: (rng.standard_normal((64, 2)), rng.standard_normal((4, 2)))),
])
def test_numpy_function_is_one_inductor_graph(fn, make):
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    rng = np.random.default_rng(0)
    for _ in range(3):
        args = make(rng)
        got, want = compiled(*args), fn(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert type(g) is type(w) and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)
    ex = kiln.explain(fn)(*make(rng))
    assert ex.graph_count == 1 and ex.break_count == 0, repr(ex)
