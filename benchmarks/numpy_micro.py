"""NumPy functions compiled: kiln (inductor backend) vs NumPy itself vs torch.compile, on CPU.

Each function is plain NumPy code on float64 arrays. Both compilers trace it as tensor code and
return ndarrays; every result is checked against NumPy's. Timings are medians of ``--reps`` calls,
interleaved (NumPy, kiln, torch.compile, NumPy, ...) so that load from other processes falls on all
three alike; compile seconds are the first call's.

    python -m benchmarks.numpy_micro                 # n = 1_000_000, 20 repetitions
    python -m benchmarks.numpy_micro --n 100000 --reps 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch


def elementwise_chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.tanh(a * 2.0 + b) * np.exp(-a * a) + np.sqrt(np.abs(b)) - 0.5 * np.sin(a - b)


def softplus_clip(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.clip(np.log1p(np.exp(a)) - b ** 2, -3.0, 3.0)


def reductions(a: np.ndarray, b: np.ndarray) -> tuple:
    x = a.reshape(-1, 1000)
    y = b.reshape(-1, 1000)
    return (x * y).sum(axis=1), np.abs(x - y).max(axis=1), ((x - x.mean(axis=1, keepdims=True)) ** 2).mean(), \
        np.linalg.norm(y, axis=1)


def softmax_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = a.reshape(-1, 1000)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def kmeans_step(points: np.ndarray, centers: np.ndarray) -> tuple:
    d = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    nearest = d.argmin(axis=1)
    onehot = (nearest[:, None] == np.arange(centers.shape[0])[None, :]).astype(np.float64)
    counts = onehot.sum(axis=0)[:, None]
    return (onehot.T @ points) / np.maximum(counts, 1.0), d.min(axis=1).sum()


def quantiles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = a.reshape(-1, 1000)
    return np.percentile(x, [5, 50, 95], axis=1) - np.median(b)


def ridge_solve(points: np.ndarray, centers: np.ndarray) -> np.ndarray:
    gram = points.T @ points + 0.1 * np.eye(points.shape[1])
    return np.linalg.solve(gram, points.T @ np.tanh(points[:, 0] * 2.0))


def _pointwise_args(n: int, rng: np.random.Generator) -> tuple:
    return rng.standard_normal(n), rng.standard_normal(n)


def _kmeans_args(n: int, rng: np.random.Generator) -> tuple:
    return rng.standard_normal((n // 16, 8)), rng.standard_normal((16, 8))


CASES: dict[str, tuple[Callable, Callable[[int, np.random.Generator], tuple]]] = {
    "elementwise_chain": (elementwise_chain, _pointwise_args),
    "softplus_clip": (softplus_clip, _pointwise_args),
    "reductions": (reductions, _pointwise_args),
    "softmax_rows": (softmax_rows, _pointwise_args),
    "kmeans_step": (kmeans_step, _kmeans_args),
    "quantiles": (quantiles, _pointwise_args),
    "ridge_solve": (ridge_solve, _kmeans_args),
}


def _same(got: Any, want: Any) -> str:
    """"ok", or what differs from NumPy's result: "values", "dtype" or "type" (a 0-d array for a scalar)."""
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return "type"
        return next((r for r in (_same(g, w) for g, w in zip(got, want)) if r != "ok"), "ok")
    if not np.allclose(got, want, rtol=1e-6, atol=1e-8):
        return "values"
    if np.asarray(got).dtype != np.asarray(want).dtype:
        return "dtype"
    return "ok" if type(got) is type(want) else f"type ({type(got).__name__})"


def _row(name: str, n: int, reps: int) -> str:
    import kiln
    fn, make = CASES[name]
    args = make(n, np.random.default_rng(0))
    kiln.reset()
    torch._dynamo.reset()
    runners = {"numpy": fn, "kiln": kiln.compile(fn, backend="inductor"), "torch.compile": torch.compile(fn)}
    first: dict[str, float] = {}
    ok: dict[str, str] = {}
    want = fn(*args)
    for label, run in runners.items():
        t0 = time.perf_counter()
        got = run(*args)
        first[label] = time.perf_counter() - t0
        ok[label] = _same(got, want)
    graphs = kiln.explain(fn)(*args)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(reps):
        for label, run in runners.items():
            t0 = time.perf_counter()
            run(*args)
            times[label].append(time.perf_counter() - t0)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return (f"| {name} | {graphs.graph_count}/{graphs.break_count} | {med['numpy']:.2f} | {med['kiln']:.2f} | "
            f"{med['torch.compile']:.2f} | {med['numpy'] / med['kiln']:.2f}x | {med['torch.compile'] / med['kiln']:.2f}x | "
            f"{first['kiln']:.1f} | {first['torch.compile']:.1f} | "
            f"{ok['kiln']}/{ok['torch.compile']} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--cases", default=",".join(CASES))
    a = p.parse_args(argv)
    print(f"n={a.n}, torch threads={torch.get_num_threads()}")
    print("| function | kiln graphs/breaks | NumPy ms | kiln ms | torch.compile ms | kiln vs NumPy | kiln vs "
          "torch.compile | kiln compile s | torch.compile compile s | results (kiln/tc) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in a.cases.split(","):
        print(_row(name, a.n, a.reps), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
