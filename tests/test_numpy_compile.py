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


def spectrum(a):
    f = np.fft.rfft(a, axis=-1)
    return np.fft.irfft(f * 0.5, n=a.shape[-1]), (np.abs(f) ** 2).sum(axis=-1), np.fft.fftshift(np.fft.fftfreq(8))


def noisy(a):
    return a + np.random.normal(0.0, 0.1, size=a.shape) + np.random.rand(*a.shape)


def _check_calls(compiled, fn, make, calls=3):
    for i in range(calls):
        args = make()
        np.random.seed(i)
        want, want_next = fn(*args), np.random.rand(3)
        np.random.seed(i)
        got, got_next = compiled(*args), np.random.rand(3)
        np.testing.assert_array_equal(got_next, want_next)  # NumPy's RNG state advanced as in eager
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert type(g) is type(w) and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("fn", [spectrum, noisy])
def test_fft_and_random_through_inductor(fn):
    """np.fft (complex values run through ATen inside the compiled graph) and np.random draws (graph
    inputs drawn before the graph on each call): one graph, NumPy's values and generator state."""
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    _check_calls(compiled, fn, lambda: (np.random.default_rng().standard_normal((4, 8)),))
    ex = kiln.explain(fn)(np.ones((4, 8)))
    assert ex.graph_count == 1 and ex.break_count == 0, repr(ex)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fn, make", [
    (softmax_plus, lambda: (np.random.default_rng().standard_normal((16, 32)),
                            np.random.default_rng().standard_normal((16, 32)))),
    (kmeans_step, lambda: (np.random.default_rng().standard_normal((64, 2)),
                           np.random.default_rng().standard_normal((4, 2)))),
    (spectrum, lambda: (np.random.default_rng().standard_normal((4, 8)),)),
    (noisy, lambda: (np.random.default_rng().standard_normal((4, 8)),)),
])
def test_numpy_on_cuda_through_inductor(fn, make):
    """Under ``with torch.device("cuda")`` the NumPy function runs as Triton code on the GPU and
    returns CPU ndarrays equal to NumPy's."""
    import torch

    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    with torch.device("cuda"):
        _check_calls(compiled, fn, make)
        ex = kiln.explain(fn)(*make())
    assert ex.graph_count == 1 and ex.break_count == 0, repr(ex)
    assert "cuda" in ex.as_text()
