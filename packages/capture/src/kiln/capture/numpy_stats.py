"""NumPy statistics traced as tensor code (numpy_table.py lists them): ``percentile``/``quantile``/
``median``, ``average``, ``ptp``, ``nansum``/``nanmean``, ``count_nonzero``, ``cov``/``corrcoef``.

Quantiles are NumPy's own computation written with a sort: for constant ``q`` the virtual index
``q * (n - 1)`` is known at capture, so each result is one or two elements of the sorted rows and NumPy's
interpolation between them ("linear", the default, "lower", "higher", "midpoint"); a slice holding NaN
gives NaN, as NumPy's. ``np.median`` is the linear 0.5 quantile (the mean of the two middle values, where
``torch.median`` gives the lower one). Integer arrays give float64 (an element for "lower"/"higher"),
float32 stays float32, a scalar ``q`` gives a NumPy scalar or an array over the other axes, a list of
``q`` a leading axis. Several axes, ``out=``, other methods, an array ``q``, a ``q`` outside its range
(NumPy raises) and the ``nan`` forms break the graph and run in NumPy. (Not ``torch.quantile``: its
interpolation differs from NumPy's in the last bits, and it needs ``q`` as a tensor of the input's dtype.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import numpy_trace as nt
from .errors import GraphBreak
from .values import NumpyArray

if TYPE_CHECKING:
    from .frame import Frame

_METHODS = ("linear", "lower", "higher", "midpoint")


def _bound(names: tuple[str, ...], args: list, kwargs: dict) -> dict:
    out = dict(zip(names, args))
    out.update(kwargs)
    return out


def _float_input(frame: Frame, name: str, a: Any) -> torch.Tensor:
    t = nt.to_array(frame, a).t
    if t.dtype in (torch.float32, torch.float64):
        return t
    if t.is_complex() or t.dtype == torch.float16:
        raise GraphBreak(f"np.{name} of a {nt.NUMPY_OF[t.dtype]} array", "it runs in NumPy")
    return nt.cast(frame, t, np.dtype("float64"))


def quantile(name: str, scale: float, q: float | None = None) -> nt.Handler:
    """np.percentile (``scale`` 100), np.quantile (1), np.median (``q`` fixed at 0.5)."""
    names = ("a", "axis", "out", "overwrite_input", "keepdims") if q is not None else \
        ("a", "q", "axis", "out", "overwrite_input", "method", "keepdims")

    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        b = _bound(names, args, kwargs)
        method = b.get("method", b.get("interpolation", "linear"))
        if b.get("out") is not None or b.get("weights") is not None or method not in _METHODS:
            raise GraphBreak(f"np.{name} with out=, weights= or method={method!r}", "it runs in NumPy")
        axis = nt._axis(b.get("axis"))
        if isinstance(axis, tuple):
            raise GraphBreak(f"np.{name} over several axes", "it runs in NumPy")
        src = nt.to_array(frame, b["a"]).t
        t = _float_input(frame, name, src)
        qs = _fractions(name, q if q is not None else b["q"], scale)
        keep = bool(b.get("keepdims", False))
        rows = nt._method(frame, t, "reshape", -1) if axis is None else nt._fn(frame, torch.movedim, t, axis, -1)
        n = rows.shape[-1]
        if not isinstance(n, int) or n == 0:
            raise GraphBreak(f"np.{name} over an axis of symbolic or zero length", "it runs in NumPy")
        ordered = nt._fn(frame, torch.sort, rows, dim=-1)[0]
        picks = [_pick(frame, ordered, f * (n - 1), method) for f in (qs if isinstance(qs, list) else [qs])]
        out = picks[0] if not isinstance(qs, list) else nt._fn(frame, torch.stack, picks)
        # NumPy gives NaN for a slice holding one (torch.sort puts NaNs last, where a pick would miss them)
        has_nan = nt._method(frame, nt._fn(frame, torch.isnan, rows), "any", dim=-1)
        out = nt._fn(frame, torch.where, has_nan, nt._fn(frame, torch.full, (), float("nan"), dtype=t.dtype,
                                                         **nt.device_kw(frame)), out)
        if keep:
            lead = [len(qs)] if isinstance(qs, list) else []
            shape = [1] * t.dim() if axis is None else [1 if k == axis % t.dim() else s for k, s in enumerate(t.shape)]
            out = nt._method(frame, out, "reshape", *lead, *shape)
        if method in ("lower", "higher") and not src.dtype.is_floating_point:  # an element: NumPy keeps its dtype
            out = nt._method(frame, out, "to", src.dtype)
        return nt.wrap_result(out)
    return call


def _pick(frame: Frame, ordered: torch.Tensor, pos: float, method: str) -> torch.Tensor:
    """The quantile at virtual index ``pos`` of each sorted row, NumPy's way (its lerp from the nearer end)."""
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = (nt._method(frame, ordered, "select", -1, k) for k in (lo, hi))
    frac = 0.5 if method == "midpoint" and hi != lo else pos - lo
    if method == "lower" or lo == hi or method == "linear" and frac == 0:
        return a
    if method == "higher":
        return b
    diff = nt._fn(frame, torch.sub, b, a)
    if frac >= 0.5:
        return nt._fn(frame, torch.sub, b, nt._fn(frame, torch.mul, diff, 1 - frac))
    return nt._fn(frame, torch.add, a, nt._fn(frame, torch.mul, diff, frac))


def _fractions(name: str, qv: Any, scale: float) -> float | list[float]:
    """``q`` as fractions in [0, 1] (constants: the positions they pick are fixed at capture)."""
    if isinstance(qv, (int, float)) and not isinstance(qv, bool):
        if not 0 <= qv <= scale:
            raise GraphBreak(f"np.{name} with q={qv} outside [0, {scale:g}] (a NumPy error)", "NumPy raises it")
        return qv / scale
    if isinstance(qv, (list, tuple)) and qv and all(isinstance(v, (int, float)) for v in qv):
        if not all(0 <= v <= scale for v in qv):
            raise GraphBreak(f"np.{name} with a q outside [0, {scale:g}] (a NumPy error)", "NumPy raises it")
        return [v / scale for v in qv]
    raise GraphBreak(f"np.{name} with q given as {type(qv).__name__} (its positions would depend on the data)",
                     "it runs in NumPy")


def average(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "axis", "weights", "returned", "keepdims"), args, kwargs)
    if b.get("returned", False):
        raise GraphBreak("np.average(returned=True)", "it runs in NumPy")
    a = nt.to_array(frame, b["a"])
    axis, keep = nt._axis(b.get("axis")), bool(b.get("keepdims", False))
    w = b.get("weights")
    if w is None:
        return nt.wrap_result(nt._reduce(frame, "mean", a.t, axis, keep, None, 0))
    wa = nt.to_array(frame, w)
    if tuple(wa.t.shape) != tuple(a.t.shape):
        raise GraphBreak("np.average with weights of another shape than the array", "it runs in NumPy")
    dt = np.result_type(nt.NUMPY_OF[a.t.dtype], nt.NUMPY_OF[wa.t.dtype])
    if nt.NUMPY_OF[a.t.dtype].kind in "biu":  # NumPy averages integers in at least float64
        dt = np.result_type(dt, np.float64)
    at, wt = nt.cast(frame, a.t, dt), nt.cast(frame, wa.t, dt)
    num = nt._reduce(frame, "sum", nt._fn(frame, torch.mul, at, wt), axis, keep, None, 0)
    den = nt._reduce(frame, "sum", wt, axis, keep, None, 0)
    return nt.wrap_result(nt._fn(frame, torch.div, num, den))


def ptp(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "axis", "out", "keepdims"), args, kwargs)
    if b.get("out") is not None:
        raise GraphBreak("np.ptp with out=", "it runs in NumPy")
    a = nt.to_array(frame, b["a"])
    axis, keep = nt._axis(b.get("axis")), bool(b.get("keepdims", False))
    hi = nt._reduce(frame, "max", a.t, axis, keep, None, 0)
    lo = nt._reduce(frame, "min", a.t, axis, keep, None, 0)
    return nt.wrap_result(nt._fn(frame, torch.sub, hi, lo))


def nan_reduction(kind: str) -> nt.Handler:
    """np.nansum (NaN read as 0) and np.nanmean (the mean of the others; NaN where all are NaN)."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        b = _bound(("a", "axis", "dtype", "out", "keepdims"), args, kwargs)
        if b.get("out") is not None or b.get("dtype") is not None or b.get("where") is not None:
            raise GraphBreak(f"np.{kind} with out=, dtype= or where=", "it runs in NumPy")
        a = nt.to_array(frame, b["a"])
        axis, keep = nt._axis(b.get("axis")), bool(b.get("keepdims", False))
        if not a.t.dtype.is_floating_point:  # no NaN in ints: NumPy's plain sum / mean
            return nt.wrap_result(nt._reduce(frame, kind[3:], a.t, axis, keep, None, 0))
        dims = {} if axis is None else {"dim": axis}
        fn = torch.nansum if kind == "nansum" else torch.nanmean
        out = nt._fn(frame, fn, a.t, **dims, keepdim=keep) if axis is not None or not keep else \
            nt._method(frame, nt._fn(frame, fn, a.t), "reshape", *([1] * a.t.dim()))
        return nt.wrap_result(out)
    return call


def count_nonzero(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "axis", "keepdims"), args, kwargs)
    if b.get("keepdims", False):
        raise GraphBreak("np.count_nonzero(keepdims=True)", "it runs in NumPy")
    a = nt.to_array(frame, b["a"])
    axis = nt._axis(b.get("axis"))
    out = nt._fn(frame, torch.count_nonzero, a.t) if axis is None else \
        nt._fn(frame, torch.count_nonzero, a.t, dim=axis)
    return nt.wrap_result(out)


def _centered(frame: Frame, name: str, m: Any, rowvar: bool) -> torch.Tensor:
    """The variables as rows, each minus its mean, in NumPy's at-least-float64 dtype."""
    a = nt.to_array(frame, m)
    if a.t.dim() > 2 or a.t.dim() == 0:
        raise GraphBreak(f"np.{name} of an array with {a.t.dim()} dimensions", "it runs in NumPy")
    t = nt.cast(frame, a.t, np.result_type(nt.dtype_of(a), np.float64))
    if a.t.dim() == 1:
        t = nt._method(frame, t, "reshape", 1, -1)
    elif not rowvar:
        t = nt._method(frame, t, "t")
    return nt._fn(frame, torch.sub, t, nt._method(frame, t, "mean", dim=1, keepdim=True))


def _cov(frame: Frame, x: torch.Tensor, correction: Any) -> torch.Tensor:
    # written out: torch.cov checks its weights' values (a data-dependent branch on fake tensors)
    prod = nt._fn(frame, torch.matmul, x, nt._method(frame, nt._method(frame, x, "conj"), "t"))
    return nt._fn(frame, torch.div, prod, x.shape[1] - correction)


def cov(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("m", "y", "rowvar", "bias", "ddof", "fweights", "aweights", "dtype"), args, kwargs)
    if any(b.get(k) is not None for k in ("y", "fweights", "aweights", "dtype")):
        raise GraphBreak("np.cov with y, weights or dtype", "it runs in NumPy")
    x = _centered(frame, "cov", b["m"], bool(b.get("rowvar", True)))
    ddof = b.get("ddof")
    c = _cov(frame, x, ddof if ddof is not None else (0 if b.get("bias", False) else 1))
    one_d = nt.to_array(frame, b["m"]).t.dim() == 1
    return NumpyArray(nt._method(frame, c, "reshape", ()) if one_d else c)  # a 0-d array, as NumPy's


def corrcoef(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("x", "y", "rowvar"), args, kwargs)
    if b.get("y") is not None or b.get("dtype") is not None or nt.to_array(frame, b["x"]).t.dim() != 2:
        raise GraphBreak("np.corrcoef with y, dtype or of a 1-d array", "it runs in NumPy")
    c = _cov(frame, _centered(frame, "corrcoef", b["x"], bool(b.get("rowvar", True))), 1)
    d = nt._fn(frame, torch.sqrt, nt._fn(frame, torch.diagonal, c))
    c = nt._fn(frame, torch.div, nt._fn(frame, torch.div, c, nt._method(frame, d, "reshape", -1, 1)),
               nt._method(frame, d, "reshape", 1, -1))
    if c.is_complex():
        raise GraphBreak("np.corrcoef of a complex array", "it runs in NumPy")
    return NumpyArray(nt._fn(frame, torch.clamp, c, -1.0, 1.0))  # NumPy clips rounding past +-1


STATS_FUNCTIONS: dict[str, nt.Handler] = {
    "percentile": quantile("percentile", 100.0), "quantile": quantile("quantile", 1.0),
    "median": quantile("median", 1.0, q=0.5),
    "average": average, "ptp": ptp, "nansum": nan_reduction("nansum"), "nanmean": nan_reduction("nanmean"),
    "count_nonzero": count_nonzero, "cov": cov, "corrcoef": corrcoef,
}
