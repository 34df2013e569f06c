"""More NumPy shape, joining, indexing and comparison functions traced as tensor code (numpy_table.py
lists them), and NumPy's scalar types called on arrays (``np.float64(a.sum())``: a cast).

Each maps onto one torch function with NumPy's argument conventions: ``moveaxis`` is ``movedim``,
``array_split``/``split`` are ``tensor_split`` (a list of arrays, as NumPy; ``split`` into unequal parts
is a NumPy error and breaks), ``take``/``take_along_axis`` read negative indices from the end as NumPy
does (torch's gather would refuse them), ``isclose`` compares in float64 for integer arrays, ``meshgrid``
is ``indexing="xy"`` by default. ``sparse=True``, ``sorter=``, ``prepend=``/``append=`` arrays and mixed
dtypes where torch needs one break the graph and run in NumPy.
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


def _bound(names: tuple[str, ...], args: list, kwargs: dict) -> dict:
    out = dict(zip(names, args))
    out.update(kwargs)
    return out


def _axes(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _promoted(frame: Frame, *values: Any) -> tuple[np.dtype, list[torch.Tensor]]:
    arrays = [nt.to_array(frame, v) for v in values]
    dt = np.result_type(*[nt.dtype_of(a) for a in arrays])
    return dt, [nt.cast(frame, a.t, dt) for a in arrays]


def moveaxis(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "source", "destination"), args, kwargs)
    a = nt.to_array(frame, b["a"])
    return NumpyArray(nt._fn(frame, torch.movedim, a.t, _axes(b["source"]), _axes(b["destination"])))


def broadcast_to(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("array", "shape"), args, kwargs)
    shape = (b["shape"],) if isinstance(b["shape"], int) else tuple(b["shape"])
    return NumpyArray(nt._method(frame, nt.to_array(frame, b["array"]).t, "expand", *shape))


def atleast(torch_fn: Any) -> nt.Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        if len(args) != 1 or kwargs:
            raise GraphBreak(f"np.{torch_fn.__name__} of several arrays", "it runs in NumPy")
        return NumpyArray(nt._fn(frame, torch_fn, nt.to_array(frame, args[0]).t))
    return call


def _int_lists(v: Any) -> bool:
    """A (nested, rectangular as NumPy needs) list or tuple of Python ints."""
    if isinstance(v, (list, tuple)):
        return bool(v) and all(_int_lists(x) for x in v) and len({np.shape(x) for x in v}) == 1
    return type(v) is int


def _index_tensor(frame: Frame, idx: Any, size: Any) -> torch.Tensor:
    """Indices (a list of ints or an integer array) as an int64 tensor, negative ones counted from the end."""
    if isinstance(idx, (list, tuple)) and _int_lists(idx):
        t = nt._fn(frame, torch.tensor, list(idx), dtype=torch.int64, **nt.device_kw(frame))
    elif isinstance(idx, NumpyArray) and idx.t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8,
                                                          torch.uint8):
        t = idx.t
    else:
        raise GraphBreak(f"numpy indices given as {type(idx).__name__}", "it runs in NumPy")
    neg = nt._fn(frame, torch.lt, t, 0)
    return nt._fn(frame, torch.where, neg, nt._fn(frame, torch.add, t, size), t)


def take(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "indices", "axis", "out", "mode"), args, kwargs)
    if b.get("out") is not None or b.get("mode", "raise") != "raise":
        raise GraphBreak("np.take with out= or mode=", "it runs in NumPy")
    t, axis, idx = nt.to_array(frame, b["a"]).t, b.get("axis"), b["indices"]
    if axis is None:
        t, axis = nt._method(frame, t, "reshape", -1), 0
    if type(idx) is int:
        return nt.wrap_result(nt._method(frame, t, "select", axis, idx)) if t.dim() > 1 or b.get("axis") is not None \
            else NumpyArray(nt._method(frame, t, "select", 0, idx), scalar=True)
    it = _index_tensor(frame, idx, t.shape[axis])
    flat = nt._fn(frame, torch.index_select, t, axis, nt._method(frame, it, "reshape", -1))
    shape = [*t.shape[:axis], *it.shape, *t.shape[axis + 1:]] if axis >= 0 else None
    if shape is None:
        raise GraphBreak("np.take with a negative axis", "it runs in NumPy")
    return NumpyArray(nt._method(frame, flat, "reshape", *shape))


def take_along_axis(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("arr", "indices", "axis"), args, kwargs)
    t, axis = nt.to_array(frame, b["arr"]).t, b.get("axis", -1)
    if axis is None:
        t, axis = nt._method(frame, t, "reshape", -1), 0
    it = _index_tensor(frame, b["indices"], t.shape[axis])
    return NumpyArray(nt._fn(frame, torch.take_along_dim, t, it, dim=axis))


def binary_fn(torch_fn: Any, scalar: bool = True, **fixed: Any) -> nt.Handler:
    """tensordot / inner / kron: two arrays promoted together, then torch's function (a 0-d result is a
    NumPy scalar when ``scalar``, a 0-d array otherwise: ``np.tensordot`` gives one)."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        _, (a, b) = _promoted(frame, args[0], args[1])
        kw = {fixed.get(k, k): (_axes(v) if k == "axes" else v) for k, v in kwargs.items()}
        rest = [_axes(v) for v in args[2:]]
        out = nt._fn(frame, torch_fn, a, b, *rest, **kw)
        return nt.wrap_result(out) if scalar else NumpyArray(out)
    return call


def diff(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "n", "axis", "prepend", "append"), args, kwargs)
    if b.get("prepend") is not None or b.get("append") is not None:
        raise GraphBreak("np.diff with prepend= or append=", "it runs in NumPy")
    t = nt.to_array(frame, b["a"]).t
    return NumpyArray(nt._fn(frame, torch.diff, t, n=b.get("n", 1), dim=b.get("axis", -1)))


def isclose(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "b", "rtol", "atol", "equal_nan"), args, kwargs)
    dt, (x, y) = _promoted(frame, b["a"], b["b"])
    if dt.kind in "biu":
        x, y = (nt.cast(frame, v, np.dtype("float64")) for v in (x, y))
    return nt.wrap_result(nt._fn(frame, torch.isclose, x, y, rtol=b.get("rtol", 1e-05), atol=b.get("atol", 1e-08),
                                 equal_nan=bool(b.get("equal_nan", False))))


def nan_to_num(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("x", "copy", "nan", "posinf", "neginf"), args, kwargs)
    if not b.get("copy", True):
        raise GraphBreak("np.nan_to_num(copy=False)", "it runs in NumPy")
    a = nt.to_array(frame, b["x"])
    out = nt._fn(frame, torch.nan_to_num, a.t, nan=b.get("nan", 0.0), posinf=b.get("posinf"), neginf=b.get("neginf"))
    return NumpyArray(out, scalar=a.scalar)


def meshgrid(frame: Frame, args: list, kwargs: dict) -> Any:
    if kwargs.get("sparse", False) or not kwargs.get("copy", True):
        raise GraphBreak("np.meshgrid(sparse=True or copy=False)", "it runs in NumPy")
    ts = [nt._method(frame, nt.to_array(frame, a).t, "reshape", -1) for a in args]
    if len({t.dtype for t in ts}) > 1:
        raise GraphBreak("np.meshgrid of arrays of different dtypes", "it runs in NumPy")
    grids = nt._fn(frame, torch.meshgrid, *ts, indexing=kwargs.get("indexing", "xy"))
    return tuple(NumpyArray(nt._method(frame, g, "clone")) for g in grids)


def split(equal: bool) -> nt.Handler:
    """np.split (equal parts or at indices) and np.array_split: ``tensor_split``, a list of views."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        b = _bound(("ary", "indices_or_sections", "axis"), args, kwargs)
        t, sec, axis = nt.to_array(frame, b["ary"]).t, b["indices_or_sections"], b.get("axis", 0)
        if isinstance(sec, int):
            if equal and t.shape[axis] % sec != 0:
                raise GraphBreak("np.split into unequal parts (a NumPy error)", "NumPy raises it")
        elif not (isinstance(sec, (list, tuple)) and all(type(i) is int for i in sec)):
            raise GraphBreak("np.split at indices that are not a list of ints", "it runs in NumPy")
        parts = nt._fn(frame, torch.tensor_split, t, sec if isinstance(sec, int) else list(sec), dim=axis)
        return [NumpyArray(p) for p in parts]
    return call


def searchsorted(frame: Frame, args: list, kwargs: dict) -> Any:
    b = _bound(("a", "v", "side", "sorter"), args, kwargs)
    if b.get("sorter") is not None:
        raise GraphBreak("np.searchsorted with sorter=", "it runs in NumPy")
    _, (a, v) = _promoted(frame, b["a"], b["v"])
    return nt.wrap_result(nt._fn(frame, torch.searchsorted, a, v, side=b.get("side", "left")))


def data_dependent(name: str) -> nt.Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        raise GraphBreak(f"np.{name}: the size of its result depends on the data",
                         "it runs in NumPy between graphs, on each call's data (torch.compile breaks here too)")
    return call


SHAPE_FUNCTIONS: dict[str, nt.Handler] = {
    **{n: data_dependent(n) for n in ("unique", "nonzero", "argwhere", "flatnonzero", "bincount", "histogram",
                                      "extract", "compress", "trim_zeros", "union1d", "intersect1d", "setdiff1d")},
    "moveaxis": moveaxis, "broadcast_to": broadcast_to, "atleast_1d": atleast(torch.atleast_1d),
    "atleast_2d": atleast(torch.atleast_2d), "atleast_3d": atleast(torch.atleast_3d), "take": take,
    "take_along_axis": take_along_axis, "tensordot": binary_fn(torch.tensordot, scalar=False, axes="dims"),
    "inner": binary_fn(torch.inner), "kron": binary_fn(torch.kron), "diff": diff, "isclose": isclose,
    "nan_to_num": nan_to_num, "meshgrid": meshgrid, "split": split(equal=True), "array_split": split(equal=False),
    "searchsorted": searchsorted, "column_stack": nt.joiner(torch.column_stack, None),
    "dstack": nt.joiner(torch.dstack, None), "heaviside": nt.ufunc(torch.heaviside),
}


def scalar_type(dt: np.dtype) -> nt.Handler:
    """``np.float64(x)``: a cast of an array (a NumPy scalar stays one); of constants, the real value."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], NumpyArray) and args[0].python is None:
            a = args[0]
            return NumpyArray(nt.cast(frame, a.t, dt), scalar=a.scalar or a.t.dim() == 0)
        if all(isinstance(v, (bool, int, float, complex, np.generic, str)) for v in [*args, *kwargs.values()]):
            return dt.type(*args, **kwargs)
        raise GraphBreak(f"np.{dt.name}() of a {', '.join(type(v).__name__ for v in args)}", "it runs in Python")
    return call


SCALAR_TYPES: dict[str, tuple[Any, nt.Handler]] = {
    dt.name: (dt.type, scalar_type(dt)) for dt in map(np.dtype, ("float64", "float32", "float16", "int64", "int32",
                                                                 "int16", "int8", "uint8", "bool", "complex64",
                                                                 "complex128"))}
