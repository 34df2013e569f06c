"""``np.fft`` traced as ``torch.fft`` with NumPy's dtypes (numpy_table.py lists them).

NumPy (2.x) computes in single precision for float32/complex64 input and in double precision for
everything else: integer and bool arrays are read as float64, so ``np.fft.fft`` of them is complex128;
``irfft``/``hfft`` return the real type of that precision; ``fftshift`` keeps the dtype; ``fftfreq`` is
float64. Arguments map one to one (``axis``/``axes`` -> ``dim``, ``n``/``s``, ``norm``); ``out=``, a
complex array given to ``rfft`` (NumPy drops its imaginary part with a warning) and float16 break
the graph and run in NumPy.
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

_SINGLE = {torch.float32, torch.complex64}


def _input(frame: Frame, name: str, a: Any, real_only: bool) -> torch.Tensor:
    t = nt.to_array(frame, a).t
    if t.dtype == torch.float16:
        raise GraphBreak(f"np.fft.{name} of a float16 array")
    if real_only and t.is_complex():
        raise GraphBreak(f"np.fft.{name} of a complex array (NumPy drops the imaginary part, with a warning)")
    if t.dtype in _SINGLE or t.dtype in (torch.float64, torch.complex128):
        return t
    return nt.cast(frame, t, np.dtype("float64"))


def transform(torch_fn: Any, size: str, dims: str, real_only: bool = False) -> nt.Handler:
    """``np.fft.X(a, n|s, axis|axes, norm)`` as ``torch.fft.X(t, n|s, dim, norm)``."""
    name = torch_fn.__name__

    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        bound = dict(zip(("a", size, dims, "norm", "out"), args))
        bound.update(kwargs)
        if bound.get("out") is not None:
            raise GraphBreak(f"np.fft.{name} with out=")
        if "a" not in bound:
            raise GraphBreak(f"np.fft.{name} without its array argument")
        t = _input(frame, name, bound["a"], real_only)
        dim = bound.get(dims)
        extra: dict[str, Any] = {"norm": bound.get("norm")}
        if dim is not None:
            extra["dim"] = tuple(dim) if isinstance(dim, list) else dim
        n = bound.get(size)
        if n is not None:
            extra[size] = tuple(n) if isinstance(n, list) else n
        return NumpyArray(nt._fn(frame, torch_fn, t, **extra))
    return call


def shift(torch_fn: Any) -> nt.Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        a = nt.to_array(frame, args[0])
        axes = args[1] if len(args) > 1 else kwargs.get("axes")
        axes = tuple(axes) if isinstance(axes, list) else axes
        return NumpyArray(nt._fn(frame, torch_fn, a.t, dim=axes))
    return call


def freq(torch_fn: Any) -> nt.Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        bound = dict(zip(("n", "d", "device"), args))
        bound.update(kwargs)
        n, d = bound["n"], bound.get("d", 1.0)
        if not isinstance(n, int) or not isinstance(d, (int, float)):
            raise GraphBreak(f"np.fft.{torch_fn.__name__} with n or d that are not Python numbers")
        return NumpyArray(nt._fn(frame, torch_fn, n, d, dtype=torch.float64, **nt.device_kw(frame)))
    return call


FFT_FUNCTIONS: dict[str, nt.Handler] = {
    "fft": transform(torch.fft.fft, "n", "axis"), "ifft": transform(torch.fft.ifft, "n", "axis"),
    "rfft": transform(torch.fft.rfft, "n", "axis", real_only=True), "irfft": transform(torch.fft.irfft, "n", "axis"),
    "hfft": transform(torch.fft.hfft, "n", "axis"), "ihfft": transform(torch.fft.ihfft, "n", "axis", real_only=True),
    "fft2": transform(torch.fft.fft2, "s", "axes"), "ifft2": transform(torch.fft.ifft2, "s", "axes"),
    "rfft2": transform(torch.fft.rfft2, "s", "axes", real_only=True), "irfft2": transform(torch.fft.irfft2, "s", "axes"),
    "fftn": transform(torch.fft.fftn, "s", "axes"), "ifftn": transform(torch.fft.ifftn, "s", "axes"),
    "rfftn": transform(torch.fft.rfftn, "s", "axes", real_only=True), "irfftn": transform(torch.fft.irfftn, "s", "axes"),
    "fftshift": shift(torch.fft.fftshift), "ifftshift": shift(torch.fft.ifftshift),
    "fftfreq": freq(torch.fft.fftfreq), "rfftfreq": freq(torch.fft.rfftfreq),
}
