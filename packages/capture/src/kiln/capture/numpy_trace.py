"""NumPy code traced as tensor code: ndarrays are fake tensors (``NumpyArray``) and ``np.*`` calls,
ndarray methods and operators are recorded as torch ops with NumPy's semantics.

Where arrays come from: ``tensor.numpy()`` (the same storage), ndarray arguments (graph inputs read
through ``torch.from_numpy``, so in-place writes reach the caller's array), and ``np`` constructors
(``np.zeros`` is float64, ``np.arange(3)`` int64, as NumPy makes them). Where they go: an array the
compiled code returns or keeps across a graph break is rebuilt as an ndarray (a scalar result as a
NumPy scalar); ``torch.from_numpy`` gives the tensor back.

Semantics kept: dtype promotion is NumPy's (``np.result_type``, NEP 50 for Python scalars), math
ufuncs on integer arrays give float64, ``mean`` of ints is float64, ``sum`` of bools/ints is int64,
``/`` of ints is float64. What the table does not cover breaks the graph (``numpy.X is not traced``)
and runs in Python on each call's own data: never a stale value.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import GraphBreak
from .values import NumpyArray

if TYPE_CHECKING:
    from .frame import Frame

Handler = Callable[["Frame", list, dict], Any]

TORCH_OF: dict[np.dtype, torch.dtype] = {
    np.dtype(n): getattr(torch, t) for n, t in [
        ("float64", "float64"), ("float32", "float32"), ("float16", "float16"), ("int64", "int64"),
        ("int32", "int32"), ("int16", "int16"), ("int8", "int8"), ("uint8", "uint8"), ("bool", "bool"),
        ("complex64", "complex64"), ("complex128", "complex128")]}
NUMPY_OF: dict[torch.dtype, np.dtype] = {v: k for k, v in TORCH_OF.items()}


def liftable(a: Any) -> bool:
    """An ndarray ``torch.from_numpy`` can share: a supported native dtype, non-negative strides."""
    return isinstance(a, np.ndarray) and a.dtype in TORCH_OF and a.dtype.isnative and \
        a.flags.writeable and all(s >= 0 for s in a.strides)


def as_np_dtype(d: Any) -> np.dtype:
    """np.float32, 'float32', np.dtype(...), float, int, bool, or a torch dtype -> np.dtype."""
    if isinstance(d, torch.dtype):
        return NUMPY_OF[d]
    try:
        out = np.dtype(d)
    except TypeError as e:
        raise GraphBreak(f"numpy dtype {d!r} is not traced") from e
    if out not in TORCH_OF:
        raise GraphBreak(f"numpy dtype {out} has no tensor dtype")
    return out


# ---- recording helpers ------------------------------------------------------------------------
def _fn(frame: Frame, fn: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    return frame.tracer.record("call_function", fn, args, kwargs, lambda: fn(*args, **kwargs))


def _method(frame: Frame, t: torch.Tensor, name: str, *args: Any, **kwargs: Any) -> Any:
    return frame.tracer.record("call_method", name, (t, *args), kwargs, lambda: getattr(t, name)(*args, **kwargs))


def cast(frame: Frame, t: torch.Tensor, dt: np.dtype) -> torch.Tensor:
    target = TORCH_OF[dt]
    return t if t.dtype == target else _method(frame, t, "to", target)


def wrap_result(t: Any) -> Any:
    """A torch result as an array value (0-d results are NumPy scalars, as ufuncs give them)."""
    if isinstance(t, torch.Tensor):
        return NumpyArray(t, scalar=t.dim() == 0)
    if isinstance(t, (tuple, list)):
        return type(t)(wrap_result(x) for x in t)
    return t


def dtype_of(v: Any) -> Any:
    """What np.result_type takes for ``v``: an array's dtype, or a Python scalar itself (weak)."""
    if isinstance(v, NumpyArray):
        return v.python() if v.python is not None else NUMPY_OF[v.t.dtype]  # a drawn Python number: weak
    if isinstance(v, (bool, int, float, complex, np.generic)):
        return v
    if isinstance(v, (torch.SymInt, torch.SymFloat)):  # a symbolic size: a weak Python number
        return 0 if isinstance(v, torch.SymInt) else 0.0
    if isinstance(v, torch.Tensor):
        raise GraphBreak("mixing a tensor and a numpy array in one operation")
    raise GraphBreak(f"numpy operation on a {type(v).__name__}")


def tensor_of(frame: Frame, v: Any, dt: np.dtype) -> Any:
    if isinstance(v, NumpyArray):
        return cast(frame, v.t, dt)
    if isinstance(v, np.generic):
        return v.item()
    return v


def to_array(frame: Frame, v: Any) -> NumpyArray:
    """``np.asarray(v)`` for a value met as a function argument."""
    if isinstance(v, NumpyArray):
        return v
    if isinstance(v, torch.Tensor):
        return tensor_to_numpy(frame, v)
    return asarray(frame, [v], {})


def tensor_to_numpy(frame: Frame, t: torch.Tensor) -> NumpyArray:
    if t.requires_grad or t.device.type != "cpu" or t.dtype not in NUMPY_OF:
        raise GraphBreak("Tensor.numpy() of a tensor that requires grad, is not on the CPU or has no numpy dtype")
    return NumpyArray(frame.tracer.on_numpy_device(t))


def device_kw(frame: Frame) -> dict:
    """``device=`` for arrays made in the trace under a ``torch.device`` context (explicit in the graph)."""
    d = frame.tracer.numpy_device
    return {} if d.type == "cpu" else {"device": d}


# ---- operators --------------------------------------------------------------------------------------
_COMPARE = {operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge}
_INPLACE_OF = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
               operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
               operator.imod: operator.mod, operator.ipow: operator.pow, operator.iand: operator.and_,
               operator.ior: operator.or_, operator.ixor: operator.xor}
_TORCH_INPLACE = {operator.add: "add_", operator.sub: "sub_", operator.mul: "mul_", operator.truediv: "div_",
                  operator.floordiv: "floor_divide_", operator.mod: "remainder_", operator.pow: "pow_",
                  operator.and_: "bitwise_and_", operator.or_: "bitwise_or_", operator.xor: "bitwise_xor_"}


def binary(frame: Frame, op: Any, a: Any, b: Any) -> Any:
    if op in _INPLACE_OF:
        return inplace(frame, _INPLACE_OF[op], a, b)
    if op is operator.matmul:
        return matmul(frame, [a, b], {})
    dt = np.result_type(dtype_of(a), dtype_of(b))
    if op is operator.truediv and dt.kind in "biu":
        dt = np.dtype("float64")
    ta, tb = tensor_of(frame, a, dt), tensor_of(frame, b, dt)
    if not isinstance(ta, torch.Tensor):  # scalar op array: keep the tensor on the left where torch needs it
        if op in _COMPARE:
            return wrap_result(_fn(frame, _SWAPPED[op], tb, ta))
        ta = _fn(frame, torch.full, (), ta, dtype=TORCH_OF[dt], **device_kw(frame))
    return wrap_result(_fn(frame, op, ta, tb))


_SWAPPED = {operator.lt: operator.gt, operator.le: operator.ge, operator.eq: operator.eq,
            operator.ne: operator.ne, operator.gt: operator.lt, operator.ge: operator.le}


def inplace(frame: Frame, op: Any, a: Any, b: Any) -> Any:
    if not isinstance(a, NumpyArray) or a.scalar:
        return binary(frame, op, a, b)
    dt = NUMPY_OF[a.t.dtype]
    if op is operator.truediv and dt.kind in "biu":
        raise GraphBreak("in-place true division of an integer numpy array (a NumPy error)")
    _method(frame, a.t, _TORCH_INPLACE[op], tensor_of(frame, b, dt))
    return a


def unary(frame: Frame, op: Any, a: NumpyArray) -> Any:
    if op is operator.not_:
        raise GraphBreak("the truth value of a numpy array")
    if op is operator.neg and a.t.dtype == torch.bool:
        raise GraphBreak("negating a boolean numpy array (a NumPy error)")
    return wrap_result(_fn(frame, op, a.t))


# ---- ufuncs -----------------------------------------------------------------------------------------------
def ufunc(torch_fn: Any, floats: bool = False, result: str | None = None) -> Handler:
    """An elementwise NumPy function: inputs promoted together (to float64 for float ufuncs on ints)."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        if kwargs.get("out") is not None or kwargs.get("where", True) is not True:
            raise GraphBreak("numpy ufunc with out= or where=")
        arrays = [to_array(frame, a) if isinstance(a, torch.Tensor) else a for a in args]
        dt = np.result_type(*[dtype_of(a) for a in arrays])
        if floats and dt.kind in "biu":
            dt = np.dtype("float64")
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            dt = as_np_dtype(kwargs["dtype"])
        ts = [tensor_of(frame, a, dt) for a in arrays]
        ts = [t if isinstance(t, torch.Tensor) else _fn(frame, torch.full, (), t, dtype=TORCH_OF[dt], **device_kw(frame))
              for t in ts]
        out = _fn(frame, torch_fn, *ts)
        if result is not None and out.dtype != TORCH_OF[np.dtype(result)]:
            out = cast(frame, out, np.dtype(result))
        return wrap_result(out)
    return call


def _round(frame: Frame, args: list, kwargs: dict) -> Any:
    a = to_array(frame, args[0])
    decimals = args[1] if len(args) > 1 else kwargs.get("decimals", 0)
    return wrap_result(_fn(frame, torch.round, a.t, decimals=decimals))


def clip(frame: Frame, args: list, kwargs: dict) -> Any:
    a = to_array(frame, args[0])
    lo = args[1] if len(args) > 1 else kwargs.get("a_min", kwargs.get("min"))
    hi = args[2] if len(args) > 2 else kwargs.get("a_max", kwargs.get("max"))
    dt = np.result_type(*[dtype_of(v) for v in (a, lo, hi) if v is not None])
    bounds = [tensor_of(frame, v, dt) if v is not None else None for v in (lo, hi)]
    return wrap_result(_fn(frame, torch.clamp, cast(frame, a.t, dt), *bounds))


def where(frame: Frame, args: list, kwargs: dict) -> Any:
    if len(args) != 3:
        raise GraphBreak("np.where with one argument (a data-dependent shape)")
    cond = to_array(frame, args[0])
    dt = np.result_type(dtype_of(args[1]), dtype_of(args[2]))
    x, y = (tensor_of(frame, v, dt) for v in args[1:])
    x = x if isinstance(x, torch.Tensor) else _fn(frame, torch.full, (), x, dtype=TORCH_OF[dt], **device_kw(frame))
    return wrap_result(_fn(frame, torch.where, cast(frame, cond.t, np.dtype(bool)), x, y))


# ---- reductions ---------------------------------------------------------------------------------------------
def _axis(axis: Any) -> Any:
    return tuple(axis) if isinstance(axis, list) else axis


def reduction(kind: str) -> Handler:
    """np.sum / mean / max / min / prod / std / var / all / any / argmax / argmin / cumsum / cumprod."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        names = ("axis", "dtype", "out", "keepdims") if kind in ("sum", "mean", "prod", "cumsum", "cumprod",
                                                                  "std", "var") else ("axis", "out", "keepdims")
        bound = dict(zip(names, args[1:]))
        bound.update(kwargs)
        if bound.get("out") is not None or bound.get("where") is not None or bound.get("initial") is not None:
            raise GraphBreak(f"np.{kind} with out=, where= or initial=")
        a = to_array(frame, args[0])
        return wrap_result(_reduce(frame, kind, a.t, _axis(bound.get("axis")), bool(bound.get("keepdims", False)),
                                   bound.get("dtype"), bound.get("ddof", 0)))
    return call


def _reduce(frame: Frame, kind: str, t: torch.Tensor, axis: Any, keep: bool, dtype: Any, ddof: Any) -> Any:
    np_dt = NUMPY_OF[t.dtype]
    if dtype is not None:
        t = cast(frame, t, as_np_dtype(dtype))
    elif kind in ("sum", "prod", "cumsum", "cumprod") and np_dt.kind in "bi" and np_dt != np.int64:
        t = cast(frame, t, np.dtype("int64"))  # NumPy accumulates small ints and bools in the platform int
    elif kind in ("mean", "std", "var") and np_dt.kind in "biu":
        t = cast(frame, t, np.dtype("float64"))
    dims = {"dim": tuple(range(t.dim())) if kind in ("sum", "mean") else None} if axis is None else {"dim": axis}
    if kind in ("cumsum", "cumprod"):
        if axis is None:
            t, dims = _method(frame, t, "reshape", -1), {"dim": 0}
        return _method(frame, t, kind, **dims)
    if kind in ("argmax", "argmin"):
        if isinstance(axis, tuple):
            raise GraphBreak(f"np.{kind} over several axes")
        return _method(frame, t, kind, **dims, keepdim=keep) if axis is not None or not keep else \
            _method(frame, _method(frame, t, kind), "reshape", *([1] * t.dim()))
    if kind in ("std", "var"):
        return _method(frame, t, kind, **dims, correction=ddof, keepdim=keep)
    method = {"max": "amax", "min": "amin"}.get(kind, kind)
    if kind in ("max", "min", "all", "any", "prod") and axis is None:
        out = _method(frame, t, method)
        return _method(frame, out, "reshape", *([1] * t.dim())) if keep else out
    if kind == "prod" and isinstance(axis, tuple):
        raise GraphBreak("np.prod over several axes")
    return _method(frame, t, method, **dims, keepdim=keep)


# ---- shapes -------------------------------------------------------------------------------------------------
def _shape_args(args: list) -> tuple:
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def reshape(frame: Frame, args: list, kwargs: dict) -> Any:
    a = to_array(frame, args[0])
    if kwargs.get("order", "C") != "C":
        raise GraphBreak("reshape with order other than 'C'")
    shape = _shape_args(list(args[1:])) if len(args) > 1 else _shape_args([kwargs.get("shape", kwargs.get("newshape"))])
    return NumpyArray(_method(frame, a.t, "reshape", *shape))


def transpose(frame: Frame, args: list, kwargs: dict) -> Any:
    a = to_array(frame, args[0])
    axes = _shape_args(list(args[1:])) if len(args) > 1 else kwargs.get("axes")
    if axes in (None, ()):
        axes = tuple(reversed(range(a.t.dim())))
    return NumpyArray(_method(frame, a.t, "permute", *axes))


def _arrays(frame: Frame, seq: Any) -> list[torch.Tensor]:
    if not isinstance(seq, (list, tuple)):
        raise GraphBreak("numpy joining of a value that is not a list or tuple")
    arrays = [to_array(frame, s) for s in seq]
    dt = np.result_type(*[dtype_of(a) for a in arrays])
    return [cast(frame, a.t, dt) for a in arrays]


def joiner(torch_fn: Any, axis_default: int | None = 0) -> Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        ts = _arrays(frame, args[0])
        if axis_default is None:  # vstack / hstack take no axis
            return NumpyArray(_fn(frame, torch_fn, ts))
        axis = args[1] if len(args) > 1 else kwargs.get("axis", axis_default)
        if axis is None:
            ts, axis = [_method(frame, t, "reshape", -1) for t in ts], 0
        return NumpyArray(_fn(frame, torch_fn, ts, axis))
    return call


def matmul(frame: Frame, args: list, kwargs: dict) -> Any:
    a, b = (to_array(frame, v) for v in args[:2])
    dt = np.result_type(dtype_of(a), dtype_of(b))
    return wrap_result(_fn(frame, torch.matmul, cast(frame, a.t, dt), cast(frame, b.t, dt)))


def dot(frame: Frame, args: list, kwargs: dict) -> Any:
    a, b = (to_array(frame, v) for v in args[:2])
    if a.t.dim() == 0 or b.t.dim() == 0:
        return binary(frame, operator.mul, a, b)
    if b.t.dim() > 2:
        raise GraphBreak("np.dot of an array with more than 2 dimensions")
    return matmul(frame, [a, b], {})


def simple(torch_fn: Any, keep_scalar: bool = False, **fixed: Any) -> Handler:
    """A function of one array and plain arguments, mapped argument for argument onto ``torch_fn``."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        a = to_array(frame, args[0])
        kw = {fixed.get(k, k): v for k, v in kwargs.items()}
        out = _fn(frame, torch_fn, a.t, *args[1:], **kw)
        return wrap_result(out) if keep_scalar else NumpyArray(out)
    return call


# ---- constructors ------------------------------------------------------------------------------------------
def _default_dtype(kwargs: dict, default: str) -> torch.dtype:
    d = kwargs.get("dtype")
    return TORCH_OF[as_np_dtype(d) if d is not None else np.dtype(default)]


def filled(value: float | None) -> Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        shape = args[0] if args else kwargs["shape"]
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        fill = value if value is not None else (args[1] if len(args) > 1 else kwargs["fill_value"])
        default = "float64" if value is not None or isinstance(fill, float) else (
            "bool" if isinstance(fill, bool) else "int64")
        dt = _default_dtype(kwargs if len(args) < 3 else {**kwargs, "dtype": args[2]}, default)
        return NumpyArray(_fn(frame, torch.full, shape, fill, dtype=dt, **device_kw(frame)))
    return call


def filled_like(value: float | None) -> Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        a = to_array(frame, args[0])
        fill = value if value is not None else (args[1] if len(args) > 1 else kwargs["fill_value"])
        dt = TORCH_OF[as_np_dtype(kwargs["dtype"])] if kwargs.get("dtype") is not None else a.t.dtype
        return NumpyArray(_fn(frame, torch.full_like, a.t, fill, dtype=dt))
    return call


def arange(frame: Frame, args: list, kwargs: dict) -> Any:
    if any(not isinstance(v, (int, float)) for v in args):
        raise GraphBreak("np.arange with bounds that are not Python numbers")
    default = "float64" if any(isinstance(v, float) for v in args) else "int64"
    return NumpyArray(_fn(frame, torch.arange, *args, dtype=_default_dtype(kwargs, default), **device_kw(frame)))


def linspace(frame: Frame, args: list, kwargs: dict) -> Any:
    start, stop = args[0], args[1]
    num = args[2] if len(args) > 2 else kwargs.get("num", 50)
    if not kwargs.get("endpoint", True) or kwargs.get("retstep") or kwargs.get("axis", 0) != 0:
        raise GraphBreak("np.linspace with endpoint=False, retstep or axis")
    return NumpyArray(_fn(frame, torch.linspace, start, stop, num, dtype=_default_dtype(kwargs, "float64"),
                          **device_kw(frame)))


def eye(frame: Frame, args: list, kwargs: dict) -> Any:
    n = args[0]
    m = args[1] if len(args) > 1 else kwargs.get("M") or n
    if kwargs.get("k", 0) != 0:
        raise GraphBreak("np.eye with k")
    return NumpyArray(_fn(frame, torch.eye, n, m, dtype=_default_dtype(kwargs, "float64"), **device_kw(frame)))


def asarray(frame: Frame, args: list, kwargs: dict, copy: bool = False) -> Any:
    v = args[0]
    dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
    if isinstance(v, NumpyArray):
        out = NumpyArray(cast(frame, v.t, as_np_dtype(dtype)) if dtype is not None else v.t)
        return NumpyArray(_method(frame, out.t, "clone")) if copy and out.t is v.t else out
    if isinstance(v, torch.Tensor):
        return asarray(frame, [tensor_to_numpy(frame, v)], kwargs, copy)
    if isinstance(v, (list, tuple)) and any(isinstance(x, (NumpyArray, torch.Tensor)) or
                                            isinstance(x, (list, tuple)) for x in v):
        return NumpyArray(_fn(frame, torch.stack, [asarray(frame, [x], kwargs).t for x in v]))
    try:
        probe = np.asarray(v, dtype=dtype)  # plain Python data: NumPy decides the dtype
    except Exception as e:
        raise GraphBreak(f"np.asarray of {type(v).__name__}") from e
    if probe.dtype not in TORCH_OF:
        raise GraphBreak(f"np.asarray giving dtype {probe.dtype}")
    return NumpyArray(_fn(frame, torch.tensor, probe.tolist(), dtype=TORCH_OF[probe.dtype], **device_kw(frame)),
                      scalar=False)


def array(frame: Frame, args: list, kwargs: dict) -> Any:
    return asarray(frame, args, kwargs, copy=kwargs.get("copy", True) is not False)


def from_numpy(frame: Frame, args: list, kwargs: dict) -> Any:
    (a,) = args
    if not isinstance(a, NumpyArray):
        raise GraphBreak(f"torch.from_numpy of a {type(a).__name__}")
    return a.t


def item_break(frame: Frame, args: list, kwargs: dict) -> Any:
    raise GraphBreak("a numpy array's value as a Python number (item/tolist): data-dependent")
