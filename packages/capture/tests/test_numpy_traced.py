"""NumPy functions traced as tensor code (numpy_linalg.py, numpy_stats.py, numpy_shapes.py): each program
is captured, then called 3 times with fresh arrays and compared with NumPy itself (values, dtypes,
ndarray / NumPy scalar / named tuple types), with its graph and break counts asserted. The breaks left
are the data-dependent ones (np.unique, a[a > 0], eigenvalues whose dtype depends on the data), where
torch.compile breaks too (test_torch_compile_breaks_where_kiln_does, which asks it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln.capture as kc

from .conftest import Recorder, assert_same

pytestmark = pytest.mark.xdist_group("packages/capture/tests/test_numpy_traced.py")

# name: (program, graphs, breaks)
P = {
    # linalg
    "moveaxis": (lambda a: np.moveaxis(a.reshape(2, 2, 4), 0, -1) * 1, 1, 0),
    "solve_vector": (lambda a: np.linalg.solve(a[:3, :3] + 3 * np.eye(3), a[:3, 0]), 1, 0),
    "solve_matrix": (lambda a: np.linalg.solve(a[:3, :3] + 3 * np.eye(3), a[:3, :2]), 1, 0),
    "solve_float32": (lambda a: np.linalg.solve(a.astype(np.float32) + 4 * np.eye(4, dtype=np.float32), a[0]), 1, 0),
    "svdvals": (lambda a: np.linalg.svd(a, compute_uv=False), 1, 0),
    "svd_result": (lambda a: (lambda r: ((r.U * r.S) @ r.Vh, r.S))(np.linalg.svd(a)), 1, 0),
    "svd_unpacked": (lambda a: (lambda u, s, vh: (u * s) @ vh)(*np.linalg.svd(a[:, :3], full_matrices=False)), 1, 0),
    "eigvalsh": (lambda a: np.linalg.eigvalsh(a @ a.T), 1, 0),
    "eigh": (lambda a: (lambda w, v: ((v * w) @ v.T, w))(*np.linalg.eigh(a @ a.T)), 1, 0),
    "qr": (lambda a: (lambda q, r: (q @ r, np.abs(np.diag(r))))(*np.linalg.qr(a)), 1, 0),
    "cholesky": (lambda a: np.linalg.cholesky(a @ a.T + 4 * np.eye(4)), 1, 0),
    "slogdet": (lambda a: np.linalg.slogdet(a + 4 * np.eye(4)), 1, 0),
    "matrix_power": (lambda a: (np.linalg.matrix_power(a, 3), np.linalg.matrix_power((a * 3).astype(np.int64), 2)), 1, 0),
    "matrix_rank": (lambda a: np.linalg.matrix_rank(a) + np.linalg.matrix_rank(np.outer(a[0], a[1])), 1, 0),
    "multi_dot": (lambda a: np.linalg.multi_dot([a, a.T, a]), 1, 0),
    "norms": (lambda a: (np.linalg.norm(a, 1), np.linalg.norm(a, "fro"), np.linalg.norm(a, np.inf, axis=1),
                         np.linalg.norm(a[0], 1), np.linalg.norm(a, keepdims=True), np.linalg.norm(a, 2),
                         np.linalg.norm(a, "nuc")), 1, 0),
    # statistics
    "percentile": (lambda a: np.percentile(a, 50), 1, 0),
    "quantile_axes": (lambda a: (np.percentile(a, [10, 90], axis=0), np.quantile(a, 0.3, axis=1, keepdims=True),
                                 np.quantile(a, [0.2], keepdims=True), np.quantile(a, 1)), 1, 0),
    "median": (lambda a: (np.median(a), np.median(a, axis=0), np.median(a[:3].astype(np.float32), axis=1)), 1, 0),
    "quantile_methods": (lambda a: (np.percentile(np.where(a > 1, np.nan, a), [20, 50], axis=0),
                                    np.percentile(a.astype(np.float32), 33, method="midpoint"),
                                    np.percentile(a, 70, method="higher"), np.quantile(a, 0.75, keepdims=True)), 1, 0),
    "percentile_int_lower": (lambda a: (np.percentile((a * 10).astype(np.int64), 25, method="lower"),
                                        np.percentile((a * 10).astype(np.int64), 25)), 1, 0),
    "average_ptp": (lambda a: (np.average(a), np.average(a, axis=0, weights=np.abs(a)), np.ptp(a, axis=1),
                               np.ptp(a), np.average((a * 3).astype(np.int32), axis=1)), 1, 0),
    "nansum_nanmean": (lambda a: (lambda b: (np.nansum(b), np.nanmean(b, axis=0)))(np.where(a > 1, np.nan, a)), 1, 0),
    "count_nonzero": (lambda a: (np.count_nonzero(a > 0), np.count_nonzero(a > 0, axis=1)), 1, 0),
    "cov_corrcoef": (lambda a: (np.cov(a), np.cov(a, rowvar=False, bias=True), np.corrcoef(a), np.cov(a[0]),
                                np.cov((a * 3).astype(np.int64), ddof=0)), 1, 0),
    # shapes, joins, indexing
    "list_index": (lambda a: (a[[0, 2]], a[:, [1, -1]], a[[0, 1], [1, 2]]), 1, 0),
    "masked_write": (lambda a: (lambda b: (b.__setitem__(b < 0, 0.0), b)[1])(a.copy()), 1, 0),
    "operators_by_name": (lambda a: (lambda b: (b.__imul__(2), b.__iadd__(1), b.__setitem__((slice(None), 0), 7.0),
                                                b.__radd__(1), b.__getitem__(1), b)[3:])(a.copy()), 1, 0),
    "broadcast_atleast_diff": (lambda a: (np.broadcast_to(a[0], (3, 4)) + 0, np.atleast_2d(a[0]), np.atleast_3d(a),
                                          np.diff(a, axis=0), np.diff(a, n=2)), 1, 0),
    "take": (lambda a: (np.take(a, [0, -1]), np.take(a, [[0, 1]], axis=1), np.take(a, 3),
                        np.take_along_axis(a, np.argsort(a, axis=1), axis=1)), 1, 0),
    "tensordot_inner_kron": (lambda a: (np.tensordot(a, a, axes=([1], [0])), np.tensordot(a, a), np.inner(a, a),
                                        np.inner(a[0], a[1]), np.kron(a[:2, :2], a[:2, :2])), 1, 0),
    "column_dstack": (lambda a: (np.column_stack([a[0], a[1]]), np.dstack([a, a])), 1, 0),
    "isclose_nan_to_num": (lambda a: (np.isclose(a, a + 1e-9), np.isclose(a, 0.1),
                                      np.nan_to_num(np.where(a > 1, np.inf, a))), 1, 0),
    "meshgrid": (lambda a: np.meshgrid(a[0], a[1, :3]), 1, 0),
    "split": (lambda a: (np.split(a, 2), np.array_split(a, 3, axis=1), np.split(a, [1, 3])), 1, 0),
    "searchsorted": (lambda a: (np.searchsorted(np.sort(a[0]), a[1]),
                                np.searchsorted(np.sort(a[0]), 0.0, side="right")), 1, 0),
    "scalar_types": (lambda a: (np.float64(a.sum()) * 2, np.float32(a.mean()), np.float32(a) + 1,
                                np.int64(a.argmax()) + 1, np.float64(2.5) * a.sum()), 1, 0),
    "scalar_returns": (lambda a: (np.sum(a), a.mean(), a[1, 2], np.argmax(a), np.all(a > -10)), 1, 0),
    "heaviside": (lambda a: np.heaviside(a, 0.5), 1, 0),
    # data-dependent: a break, as torch.compile's (the part before it is a graph; the part after it sees a
    # new size on the second call and is compiled again with a symbolic one: 1 + 2 graphs)
    "unique": (lambda a: np.unique(np.round(a * 2)), 1, 1),
    "mask_index": (lambda a: a[a > 0] * 2, 3, 1),
    "mask_sum": (lambda a: (a * 2)[a > 0].sum(), 3, 1),
    "eigvals": (lambda a: np.linalg.eigvals(a), 0, 1),
    "nanmedian": (lambda a: np.nanmedian(np.where(a > 1, np.nan, a), axis=0), 1, 1),
}


@pytest.mark.parametrize("name", sorted(P))
def test_numpy_program_matches_numpy_on_fresh_inputs(name):
    fn, graphs, breaks = P[name]
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(fn, rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            a = np.random.default_rng(200 + i).standard_normal((4, 4))
            want = fn(a.copy())
            got = opt(a.copy())
            assert_same(got, want)
        assert rec.count == graphs, [g.code for g in rec.graphs]
        assert kc.explain(fn)(a).break_count == breaks


def test_break_reasons_say_why():
    reasons = {name: [b.reason for b in kc.explain(P[name][0])(np.ones((4, 4))).break_reasons]
               for name in ("unique", "mask_index", "eigvals")}
    assert "depends on the data" in reasons["unique"][0]
    assert "boolean-mask indexing" in reasons["mask_index"][0]
    assert "every eigenvalue is real" in reasons["eigvals"][0]


def test_solve_with_a_stack_of_vectors_runs_in_numpy():
    """NumPy 2 reads b of shape (n, m) beside a of (n, m, m) as matrices (an error here), torch as vectors."""
    def f(a, b):
        return np.linalg.solve(a, b)
    a = np.random.default_rng(0).standard_normal((2, 3, 3)) + 3 * np.eye(3)
    b = np.random.default_rng(1).standard_normal((2, 3))
    opt = kc.optimize(f, Recorder())
    with pytest.raises(ValueError):
        f(a, b)
    with pytest.raises(ValueError):
        opt(a, b)


def test_torch_compile_breaks_where_kiln_does():
    """The data-dependent breaks above are torch.compile's too (the reference, asked here)."""
    import torch._dynamo as dynamo

    for name in ("unique", "mask_index"):
        dynamo.reset()
        out = dynamo.explain(P[name][0])(np.random.default_rng(0).standard_normal((4, 4)))
        assert len(out.break_reasons) >= 1, name
