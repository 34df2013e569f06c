"""``np.linalg`` traced as ``torch.linalg`` with NumPy's dtypes and result types (numpy_table.py lists them).

NumPy computes float32/complex64 in single precision and everything else (ints, bools) in float64;
float16 is a NumPy error, so it breaks the graph and NumPy raises. Results are NumPy's named tuples
(``SVDResult``, ``EighResult``, ``QRResult``, ``SlogdetResult``) of ndarrays, full reductions NumPy
scalars. Decompositions whose vectors are defined up to sign (``svd``, ``eigh``, ``qr``) give torch's
LAPACK signs, as torch.compile does; their values, reconstructions and ``compute_uv=False`` forms
equal NumPy's. What differs in kind breaks and runs in NumPy: ``eig``/``eigvals`` (NumPy returns a
real array when every eigenvalue is real: the dtype depends on the data), ``lstsq`` (its rank and
singular values), ``solve`` with a stack of right-hand vectors (NumPy 2 reads it as matrices, torch as
vectors), ``svd(hermitian=True)``, ``qr(mode="raw")``, ``norm`` with an unusual ``ord``. A singular
matrix raises torch's ``LinAlgError`` (a ``RuntimeError``) where NumPy raises ``numpy.linalg.LinAlgError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import numpy_trace as nt
from .errors import GraphBreak
from .values import NumpyArray

if TYPE_CHECKING:
    from .frame import Frame

_RESULTS = {name: getattr(np.linalg, name)(np.eye(2)).__class__ for name in ("svd", "eigh", "qr", "slogdet")}
_EXACT = {"float32", "float64", "complex64", "complex128"}


def _float_dtype(*arrays: NumpyArray) -> np.dtype:
    dt = np.result_type(*[nt.dtype_of(a) for a in arrays])
    if dt.name == "float16":
        raise GraphBreak("np.linalg on a float16 array (a NumPy error)", "NumPy raises it in Python")
    return dt if dt.name in _EXACT else np.dtype("float64")


def _input(frame: Frame, name: str, a: Any, square: bool = False) -> torch.Tensor:
    arr = nt.to_array(frame, a)
    if arr.t.dim() < 2:
        raise GraphBreak(f"np.linalg.{name} of an array with fewer than 2 dimensions (a NumPy error)")
    if square and arr.t.shape[-1] != arr.t.shape[-2]:
        raise GraphBreak(f"np.linalg.{name} of a non-square matrix (a NumPy error)")
    return nt.cast(frame, arr.t, _float_dtype(arr))


def _bound(names: tuple[str, ...], args: list, kwargs: dict) -> dict:
    out = dict(zip(names, args))
    out.update(kwargs)
    return out


def unary(name: str, torch_fn: Any, square: bool = True) -> nt.Handler:
    """``inv``, ``det``, ``pinv``, ``eigvalsh``-like functions of one matrix and no options."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        b = _bound(("a", "UPLO"), args, kwargs) if name in ("eigvalsh",) else _bound(("a",), args, kwargs)
        extra = {"UPLO": b["UPLO"]} if "UPLO" in b else {}
        return nt.wrap_result(nt._fn(frame, torch_fn, _input(frame, name, b["a"], square), **extra))
    return call


def solve(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "b"), args, kwargs)
    a_arr, b_arr = nt.to_array(frame, b["a"]), nt.to_array(frame, b["b"])
    if b_arr.t.dim() != 1 and b_arr.t.dim() != a_arr.t.dim():
        raise GraphBreak("np.linalg.solve with a stack of right-hand sides of another rank than the matrices "
                         "(NumPy 2 and torch read them differently)", "it runs in NumPy")
    dt = _float_dtype(a_arr, b_arr)
    _input(frame, "solve", a_arr, square=True)
    return nt.wrap_result(nt._fn(frame, torch.linalg.solve, nt.cast(frame, a_arr.t, dt), nt.cast(frame, b_arr.t, dt)))


def svd(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "full_matrices", "compute_uv", "hermitian"), args, kwargs)
    if b.get("hermitian", False):
        raise GraphBreak("np.linalg.svd(hermitian=True)", "it runs in NumPy")
    t = _input(frame, "svd", b["a"])
    if not b.get("compute_uv", True):
        return NumpyArray(nt._fn(frame, torch.linalg.svdvals, t))
    u, s, vh = nt._fn(frame, torch.linalg.svd, t, full_matrices=bool(b.get("full_matrices", True)))
    return _RESULTS["svd"](NumpyArray(u), NumpyArray(s), NumpyArray(vh))


def eigh(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "UPLO"), args, kwargs)
    w, v = nt._fn(frame, torch.linalg.eigh, _input(frame, "eigh", b["a"], square=True), UPLO=b.get("UPLO", "L"))
    return _RESULTS["eigh"](NumpyArray(w), NumpyArray(v))


def qr(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "mode"), args, kwargs)
    mode = b.get("mode", "reduced")
    if mode not in ("reduced", "complete", "r"):
        raise GraphBreak(f"np.linalg.qr(mode={mode!r})", "it runs in NumPy")
    q, r = nt._fn(frame, torch.linalg.qr, _input(frame, "qr", b["a"]), mode="reduced" if mode == "r" else mode)
    return NumpyArray(r) if mode == "r" else _RESULTS["qr"](NumpyArray(q), NumpyArray(r))


def cholesky(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a",), args, kwargs)
    t = _input(frame, "cholesky", b["a"], square=True)
    return NumpyArray(nt._fn(frame, torch.linalg.cholesky, t, upper=bool(b.get("upper", False))))


def slogdet(frame: Frame, args: list, kwargs: dict) -> Any:
    sign, logabs = nt._fn(frame, torch.linalg.slogdet, _input(frame, "slogdet", _bound(("a",), args, kwargs)["a"],
                                                               square=True))
    return _RESULTS["slogdet"](nt.wrap_result(sign), nt.wrap_result(logabs))


def matrix_power(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "n"), args, kwargs)
    a = nt.to_array(frame, b["a"])
    n = b["n"]
    if not isinstance(n, int) or a.t.dim() < 2:
        raise GraphBreak("np.linalg.matrix_power with a non-constant power or a vector")
    # a non-negative power is repeated matmul in the array's own dtype (ints stay ints), a negative one inverts
    t = a.t if n >= 0 and a.t.dtype != torch.bool else _input(frame, "matrix_power", a, square=True)
    return NumpyArray(nt._fn(frame, torch.linalg.matrix_power, t, n))


def matrix_rank(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("A", "tol", "hermitian"), args, kwargs)
    if b.get("tol") is not None or b.get("rtol") is not None or b.get("hermitian", False):
        raise GraphBreak("np.linalg.matrix_rank with tol, rtol or hermitian", "it runs in NumPy")
    # NumPy's default tolerance, S.max() * max(M, N) * eps, is torch's default rtol
    return nt.wrap_result(nt._fn(frame, torch.linalg.matrix_rank, _input(frame, "matrix_rank", b["A"])))


def multi_dot(frame: Frame, args: list, kwargs: dict) -> Any:
    arrays = [nt.to_array(frame, a) for a in _bound(("arrays",), args, kwargs)["arrays"]]
    dt = np.result_type(*[nt.dtype_of(a) for a in arrays])
    return nt.wrap_result(nt._fn(frame, torch.linalg.multi_dot, [nt.cast(frame, a.t, dt) for a in arrays]))


_VECTOR_ORDS = (None, 1, 2, -1, -2, 0, float("inf"), float("-inf"))
_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, float("inf"), float("-inf"))


def norm(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("x", "ord", "axis", "keepdims"), args, kwargs)
    a = nt.to_array(frame, b["x"])
    t = a.t if a.t.dtype.is_floating_point or a.t.is_complex() else nt.cast(frame, a.t, np.dtype("float64"))
    ord_, axis, keep = b.get("ord"), nt._axis(b.get("axis")), bool(b.get("keepdims", False))
    if axis is None and (ord_ is None or t.dim() == 1):  # NumPy: the 2-norm of the flattened array
        if ord_ not in _VECTOR_ORDS:
            raise GraphBreak(f"np.linalg.norm(ord={ord_!r})", "it runs in NumPy")
        out = nt._fn(frame, torch.linalg.vector_norm, t, 2 if ord_ is None else ord_)
        return nt.wrap_result(nt._method(frame, out, "reshape", *([1] * t.dim())) if keep else out)
    if isinstance(axis, int) or axis is None and t.dim() == 1:
        if ord_ not in _VECTOR_ORDS:
            raise GraphBreak(f"np.linalg.norm(ord={ord_!r}) over one axis", "it runs in NumPy")
        return nt.wrap_result(nt._fn(frame, torch.linalg.vector_norm, t, 2 if ord_ is None else ord_, dim=axis,
                                     keepdim=keep))
    dims = (0, 1) if axis is None and t.dim() == 2 else axis
    if not isinstance(dims, tuple) or len(dims) != 2 or ord_ not in (None, *_MATRIX_ORDS):
        raise GraphBreak(f"np.linalg.norm(ord={ord_!r}, axis={axis!r})", "it runs in NumPy")
    return nt.wrap_result(nt._fn(frame, torch.linalg.matrix_norm, t, "fro" if ord_ is None else ord_, dim=dims,
                                 keepdim=keep))


def _refuse(name: str, why: str) -> nt.Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        raise GraphBreak(f"np.linalg.{name}: {why}", "it runs in NumPy on each call's data")
    return call


LINALG_FUNCTIONS: dict[str, nt.Handler] = {
    "inv": unary("inv", torch.linalg.inv), "det": unary("det", torch.linalg.det),
    "pinv": unary("pinv", torch.linalg.pinv, square=False), "eigvalsh": unary("eigvalsh", torch.linalg.eigvalsh),
    "solve": solve, "svd": svd, "svdvals": lambda f, a, k: svd(f, [a[0]], {"compute_uv": False}),
    "eigh": eigh, "qr": qr, "cholesky": cholesky, "slogdet": slogdet, "matrix_power": matrix_power,
    "matrix_rank": matrix_rank, "multi_dot": multi_dot, "norm": norm,
    "eig": _refuse("eig", "NumPy returns a real array when every eigenvalue is real (a data-dependent dtype)"),
    "eigvals": _refuse("eigvals", "NumPy returns a real array when every eigenvalue is real (a data-dependent "
                                  "dtype)"),
    "lstsq": _refuse("lstsq", "its rank and singular values are not traced"),
}
