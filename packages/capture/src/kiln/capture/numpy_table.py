"""The NumPy functions, ndarray methods and attributes the trace covers (numpy_trace.py), in tables
that can be listed: ``NUMPY_FUNCTIONS`` (by the function object), ``ARRAY_METHODS``, ``array_attr``."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import numpy_trace as nt
from .errors import GraphBreak
from .numpy_fft import FFT_FUNCTIONS
from .numpy_linalg import LINALG_FUNCTIONS
from .numpy_shapes import SCALAR_TYPES, SHAPE_FUNCTIONS
from .numpy_stats import STATS_FUNCTIONS
from .values import NumpyArray

if TYPE_CHECKING:
    from .frame import Frame

_FLOAT_UFUNCS = {
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "arcsin": torch.asin, "arccos": torch.acos,
    "arctan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "exp": torch.exp,
    "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2, "log10": torch.log10,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "cbrt": lambda t: torch.sign(t) * torch.abs(t) ** (1.0 / 3),
    "arctan2": torch.atan2, "hypot": torch.hypot, "true_divide": torch.true_divide, "divide": torch.true_divide,
    "deg2rad": torch.deg2rad, "rad2deg": torch.rad2deg, "radians": torch.deg2rad, "degrees": torch.rad2deg,
    "logaddexp": torch.logaddexp,
}
_SAME_UFUNCS = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "power": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "abs": torch.abs, "absolute": torch.abs, "negative": torch.neg, "positive": torch.positive,
    "square": torch.square, "sign": torch.sign, "floor_divide": torch.floor_divide, "mod": torch.remainder,
    "remainder": torch.remainder, "fmod": torch.fmod, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "rint": torch.round, "reciprocal": torch.reciprocal,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "invert": torch.bitwise_not,
}
_BOOL_UFUNCS = {
    "greater": torch.gt, "greater_equal": torch.ge, "less": torch.lt, "less_equal": torch.le,
    "equal": torch.eq, "not_equal": torch.ne, "isnan": torch.isnan, "isinf": torch.isinf,
    "isfinite": torch.isfinite, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_not": torch.logical_not, "logical_xor": torch.logical_xor, "signbit": torch.signbit,
}
_REDUCTIONS = {"sum": "sum", "mean": "mean", "max": "max", "amax": "max", "min": "min", "amin": "min",
               "prod": "prod", "std": "std", "var": "var", "all": "all", "any": "any", "argmax": "argmax",
               "argmin": "argmin", "cumsum": "cumsum", "cumprod": "cumprod"}


def _squeeze(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    axis = args[1] if len(args) > 1 else kwargs.get("axis")
    t = nt._method(frame, a.t, "squeeze") if axis is None else nt._method(frame, a.t, "squeeze", axis)
    return NumpyArray(t)


def _expand_dims(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    axis = args[1] if len(args) > 1 else kwargs["axis"]
    return NumpyArray(nt._method(frame, a.t, "unsqueeze", axis))


def _flip(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    axis = args[1] if len(args) > 1 else kwargs.get("axis")
    dims = tuple(range(a.t.dim())) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    return NumpyArray(nt._fn(frame, torch.flip, a.t, dims))


def _swapaxes(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    return NumpyArray(nt._method(frame, a.t, "transpose", args[1], args[2]))


def _repeat(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    repeats = args[1] if len(args) > 1 else kwargs["repeats"]
    axis = args[2] if len(args) > 2 else kwargs.get("axis")
    if not isinstance(repeats, int):
        raise GraphBreak("np.repeat with per-element repeats")
    t = a.t if axis is not None else nt._method(frame, a.t, "reshape", -1)
    return NumpyArray(nt._fn(frame, torch.repeat_interleave, t, repeats, dim=0 if axis is None else axis))


def _tile(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    reps = args[1] if len(args) > 1 else kwargs["reps"]
    return NumpyArray(nt._fn(frame, torch.tile, a.t, (reps,) if isinstance(reps, int) else tuple(reps)))


def _roll(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    shift = args[1] if len(args) > 1 else kwargs["shift"]
    axis = args[2] if len(args) > 2 else kwargs.get("axis")
    if axis is None:
        flat = nt._fn(frame, torch.roll, nt._method(frame, a.t, "reshape", -1), shift)
        return NumpyArray(nt._method(frame, flat, "reshape", *a.t.shape))
    return NumpyArray(nt._fn(frame, torch.roll, a.t, shift, axis))


def _outer(frame: Frame, args: list, kwargs: dict) -> Any:
    a, b = (nt.to_array(frame, v) for v in args[:2])
    dt = np.result_type(nt.dtype_of(a), nt.dtype_of(b))
    flat = [nt._method(frame, nt.cast(frame, v.t, dt), "reshape", -1) for v in (a, b)]
    return NumpyArray(nt._fn(frame, torch.outer, *flat))


def _einsum(frame: Frame, args: list, kwargs: dict) -> Any:
    eq, *ops = args
    arrays = [nt.to_array(frame, o) for o in ops]
    dt = np.result_type(*[nt.dtype_of(a) for a in arrays])
    return nt.wrap_result(nt._fn(frame, torch.einsum, eq, *[nt.cast(frame, a.t, dt) for a in arrays]))


def _axis_arg(args: list, kwargs: dict) -> int:
    axis = args[1] if len(args) > 1 else kwargs.get("axis", -1)
    if axis is None or kwargs.get("kind") not in (None, "stable", "quicksort", "mergesort"):
        raise GraphBreak("np.sort/argsort with axis=None or an unusual kind")
    return axis


def _sort(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    pair = nt._method(frame, a.t, "sort", dim=_axis_arg(args, kwargs), stable=True)
    return NumpyArray(pair[0])  # the tracer gave each item of the result its own node


def _argsort(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    return NumpyArray(nt._method(frame, a.t, "argsort", dim=_axis_arg(args, kwargs), stable=True))


def _trace(frame: Frame, args: list, kwargs: dict) -> Any:
    a = nt.to_array(frame, args[0])
    return nt.wrap_result(nt._reduce(frame, "sum", nt._method(frame, a.t, "diagonal"), None, False, None, 0))


def _like_shape(frame: Frame, args: list, kwargs: dict) -> Any:
    return tuple(nt.to_array(frame, args[0]).t.shape)


def _build() -> dict[int, tuple[Any, nt.Handler]]:
    table: dict[str, nt.Handler] = {}
    table.update({n: nt.ufunc(f, floats=True) for n, f in _FLOAT_UFUNCS.items()})
    table.update({n: nt.ufunc(f) for n, f in _SAME_UFUNCS.items()})
    table.update({n: nt.ufunc(f, result="bool") for n, f in _BOOL_UFUNCS.items()})
    table.update({n: nt.reduction(k) for n, k in _REDUCTIONS.items()})
    table.update({
        "round": nt._round, "around": nt._round, "clip": nt.clip, "where": nt.where,
        "reshape": nt.reshape, "transpose": nt.transpose, "squeeze": _squeeze, "expand_dims": _expand_dims,
        "concatenate": nt.joiner(torch.cat), "stack": nt.joiner(torch.stack), "vstack": nt.joiner(torch.vstack, None),
        "hstack": nt.joiner(torch.hstack, None), "flip": _flip, "swapaxes": _swapaxes, "repeat": _repeat,
        "tile": _tile, "roll": _roll, "matmul": nt.matmul, "dot": nt.dot, "outer": _outer, "einsum": _einsum,
        "ravel": lambda f, a, k: NumpyArray(nt._method(f, nt.to_array(f, a[0]).t, "reshape", -1)),
        "zeros": nt.filled(0.0), "ones": nt.filled(1.0), "empty": nt.filled(0.0), "full": nt.filled(None),
        "zeros_like": nt.filled_like(0), "ones_like": nt.filled_like(1), "empty_like": nt.filled_like(0),
        "full_like": nt.filled_like(None), "arange": nt.arange, "linspace": nt.linspace, "eye": nt.eye,
        "identity": nt.eye, "asarray": nt.asarray, "array": nt.array, "ascontiguousarray": nt.asarray,
        "copy": lambda f, a, k: nt.asarray(f, a, k, copy=True), "shape": _like_shape,
        "sort": _sort, "argsort": _argsort,
        "triu": nt.simple(torch.triu), "tril": nt.simple(torch.tril), "diag": nt.simple(torch.diag),
        "trace": _trace, "cross": nt.simple(torch.linalg.cross), **STATS_FUNCTIONS, **SHAPE_FUNCTIONS,
    })
    out: dict[int, tuple[Any, nt.Handler]] = {}
    for name, handler in table.items():
        fn = getattr(np, name, None)
        if fn is not None:
            out[id(fn)] = (fn, handler)
    for name, handler in LINALG_FUNCTIONS.items():
        fn = getattr(np.linalg, name)
        out[id(fn)] = (fn, handler)
    for entry in SCALAR_TYPES.values():
        out[id(entry[0])] = entry
    for name, handler in FFT_FUNCTIONS.items():
        fn = getattr(np.fft, name)
        out[id(fn)] = (fn, handler)
    out[id(torch.from_numpy)] = (torch.from_numpy, nt.from_numpy)
    return out


NUMPY_FUNCTIONS = _build()


def constant_ufunc_call(fn: Any, args: list, kwargs: dict) -> bool:
    """``np.sqrt(16.0)``: a ufunc of constants gives a NumPy scalar computed at capture (guarded inputs)."""
    return isinstance(fn, np.ufunc) and all(isinstance(a, (bool, int, float, complex, np.generic))
                                             for a in [*args, *kwargs.values()])


def numpy_handler(fn: Any) -> nt.Handler | None:
    entry = NUMPY_FUNCTIONS.get(id(fn))
    return entry[1] if entry is not None and entry[0] is fn else None


# ---- ndarray methods and attributes ------------------------------------------------------------------
def _astype(frame: Frame, args: list, kwargs: dict) -> Any:
    a, dtype = args[0], args[1] if len(args) > 1 else kwargs["dtype"]
    t = nt.cast(frame, a.t, nt.as_np_dtype(dtype))
    return NumpyArray(nt._method(frame, t, "clone") if t is a.t and kwargs.get("copy", True) else t, scalar=a.scalar)


def _copy(frame: Frame, args: list, kwargs: dict) -> Any:
    return NumpyArray(nt._method(frame, args[0].t, "clone"), scalar=args[0].scalar)


def _fill(frame: Frame, args: list, kwargs: dict) -> Any:
    nt._method(frame, args[0].t, "fill_", args[1])


def _method_reshape(frame: Frame, args: list, kwargs: dict) -> Any:
    return nt.reshape(frame, [args[0], nt._shape_args(list(args[1:]))], kwargs)


def _method_transpose(frame: Frame, args: list, kwargs: dict) -> Any:
    return nt.transpose(frame, [args[0], *([nt._shape_args(list(args[1:]))] if len(args) > 1 else [])], kwargs)


_DUNDER_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow, "matmul": operator.matmul,
    "and": operator.and_, "or": operator.or_, "xor": operator.xor, "iadd": operator.iadd, "isub": operator.isub,
    "imul": operator.imul, "itruediv": operator.itruediv, "ifloordiv": operator.ifloordiv, "imod": operator.imod,
    "ipow": operator.ipow, "iand": operator.iand, "ior": operator.ior, "ixor": operator.ixor,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
    "ne": operator.ne,
}


def _dunder(op: Any, reflected: bool = False) -> nt.Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        a, b = args[0], args[1]
        return nt.binary(frame, op, b, a) if reflected else nt.binary(frame, op, a, b)
    return call


ARRAY_METHODS: dict[str, nt.Handler] = {
    **{n: nt.reduction(k) for n, k in _REDUCTIONS.items() if n not in ("amax", "amin")},
    "reshape": _method_reshape, "transpose": _method_transpose, "astype": _astype, "copy": _copy,
    "flatten": lambda f, a, k: NumpyArray(nt._method(f, a[0].t, "reshape", -1)),
    "ravel": lambda f, a, k: NumpyArray(nt._method(f, a[0].t, "reshape", -1)),
    "squeeze": _squeeze, "clip": nt.clip, "round": nt._round, "dot": nt.dot, "fill": _fill,
    "swapaxes": _swapaxes, "repeat": _repeat, "item": nt.item_break, "tolist": nt.item_break,
    "__array__": nt.item_break,
    # operators called by name (``b.__imul__(2)``, ``b.__setitem__(k, v)``), as the operators themselves
    "__getitem__": lambda f, a, k: array_getitem(f, a[0], a[1]),
    "__setitem__": lambda f, a, k: array_setitem(f, a[0], a[1], a[2]),
    **{f"__{n}__": _dunder(op) for n, op in _DUNDER_OPS.items()},
    **{f"__r{n}__": _dunder(op, reflected=True) for n, op in _DUNDER_OPS.items() if not n.startswith("i")},
}


def array_attr(frame: Frame, a: NumpyArray, name: str) -> Any:
    if a.python is not None:
        raise GraphBreak(f"{a.python.__name__}.{name} of a number drawn by numpy random",
                         "it runs in Python on the drawn value")
    t = a.t
    if name == "shape":
        return tuple(t.shape)
    if name == "ndim":
        return t.dim()
    if name == "size":
        return t.numel()
    if name == "dtype":
        return nt.NUMPY_OF[t.dtype]
    if name == "itemsize":
        return t.element_size()
    if name == "nbytes":
        return t.numel() * t.element_size()
    if name == "T":
        return nt.transpose(frame, [a], {})
    if name in ("real", "imag") and not t.is_complex():
        return a if name == "real" else NumpyArray(nt._fn(frame, torch.zeros_like, t))
    if name in ("real", "imag"):  # views of a complex array, as NumPy's
        return NumpyArray(nt._fn(frame, torch.real if name == "real" else torch.imag, t), scalar=a.scalar)
    if name in ARRAY_METHODS:
        return _BoundArrayMethod(a, name)
    raise GraphBreak(f"ndarray.{name} is not traced")


class _BoundArrayMethod:
    """``arr.sum`` before it is called (call_array_method runs it)."""

    __slots__ = ("array", "name")

    def __init__(self, array: NumpyArray, name: str) -> None:
        self.array, self.name = array, name


def call_array_method(frame: Frame, m: _BoundArrayMethod, args: list, kwargs: dict) -> Any:
    return ARRAY_METHODS[m.name](frame, [m.array, *args], kwargs)


def array_getitem(frame: Frame, a: NumpyArray, key: Any) -> Any:
    if a.python is not None:
        raise GraphBreak("indexing a number drawn by numpy random", "it runs in Python (and raises, as eager)")
    key = _index(frame, key)
    keys = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, torch.Tensor) and k.dtype == torch.bool and k.dim() > 0 for k in keys):
        raise GraphBreak("boolean-mask indexing of a numpy array (a[a > 0]): the result's size depends on the data",
                         "it runs in NumPy between graphs, as torch.compile does; np.where(mask, a, 0) or "
                         "a masked write (a[a > 0] = 0) stays in the graph")
    out = frame.tracer.record("call_function", operator.getitem, (a.t, key), {}, lambda: a.t[key])
    # integers only (0-d integer arrays too: ``a[np.random.choice(3)]``) down to 0-d: a NumPy scalar
    full = out.dim() == 0 and all(type(k) is int or isinstance(k, torch.Tensor) and k.dim() == 0 and
                                  not k.dtype.is_floating_point and k.dtype != torch.bool for k in keys)
    return NumpyArray(out, scalar=full)


def array_setitem(frame: Frame, a: NumpyArray, key: Any, value: Any) -> None:
    key = _index(frame, key)
    v = nt.tensor_of(frame, value, nt.NUMPY_OF[a.t.dtype]) if isinstance(value, NumpyArray) else \
        (value.item() if isinstance(value, np.generic) else value)
    frame.tracer.record("call_function", operator.setitem, (a.t, key, v), {}, lambda: a.t.__setitem__(key, v))


def _index(frame: Frame, key: Any) -> Any:
    if isinstance(key, NumpyArray):
        return key.t
    if isinstance(key, tuple):
        return tuple(_index(frame, k) for k in key)
    if isinstance(key, np.generic):
        return key.item()
    if isinstance(key, list):
        if not all(type(k) is int for k in key):  # lists of bools are masks (NumPy checks their length)
            raise GraphBreak("indexing a numpy array with a list that is not a list of ints")
        return nt._fn(frame, torch.tensor, key, dtype=torch.int64, **nt.device_kw(frame))
    return key


BoundArrayMethod = _BoundArrayMethod

