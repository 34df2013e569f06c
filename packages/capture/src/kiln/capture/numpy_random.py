"""NumPy's random numbers in compiled code: where the state lives, and when the draws happen.

Note: the rule. NumPy's generator state lives in NumPy, never in the graph. Every draw
(``np.random.rand(3, 4)``, ``rng.normal(size=5)`` on a ``RandomState``/``Generator`` read from the
frame) whose arguments are constants becomes a graph input computed by that very call, in Python,
on every call of the compiled function, just before the graph runs, in program order; seeds
(``np.random.seed(0)``) run at the same place in the same order, or after the graph when no draw of
the graph follows them. Nothing in a graph reads or writes NumPy's state, so running its NumPy RNG
calls in order before it gives eager's values and leaves the state exactly as eager leaves it (the
draws are the same calls, with the same arguments, in the same order). At capture nothing is drawn:
the shape and dtype come from the same call on a scratch generator. A draw returning a Python
number (``np.random.rand()``, ``randint(0, 10)``) is a graph input the same way, used by operators
only (see the note on Python numbers below). What this cannot model breaks the graph and runs in
Python: arguments that are arrays or symbolic sizes, ``shuffle`` (writes its argument),
``get_state``/``set_state``, making a generator inside the compiled code (``default_rng(0)``: the
break makes it per call; its draws after the break are graph inputs), and any NumPy RNG call
inside a ``torch.cond`` branch.
(torch.compile's rule is a graph break at every ``np.random`` call.)
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import GraphBreak
from .numpy_trace import NUMPY_OF, binary, cast, liftable
from .values import NumpyArray

if TYPE_CHECKING:
    from .frame import Frame

_GLOBAL = "__import__('numpy').random.mtrand._rand"  # the RandomState behind np.random.*
_SEEDS = frozenset({"seed"})
_MAKERS = {np.random.default_rng: "default_rng", np.random.RandomState: "RandomState",
           np.random.Generator: "Generator"}
_BREAKS = frozenset({"get_state", "set_state", "shuffle", "spawn", "bit_generator", "__getstate__",
                     "__setstate__", "__reduce__", "jumped", "bytes"})


def rng_call(fn: Any) -> tuple[Any, str] | None:
    """``(generator, method name)`` when ``fn`` is a NumPy RNG call, else None."""
    if "numpy" not in sys.modules:
        return None
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, (np.random.RandomState, np.random.Generator)):
        return owner, getattr(fn, "__name__", "")
    if fn is np.random.seed:
        return np.random.mtrand._rand, "seed"
    if fn in _MAKERS:
        return None, _MAKERS[fn]
    if not isinstance(fn, type) and str(getattr(fn, "__module__", "")).startswith("numpy.random"):
        return None, getattr(fn, "__name__", "")  # set_bit_generator and the like: run in Python
    return None


def call(frame: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    """A NumPy RNG call met in traced code (see the module's note)."""
    owner, name = rng_call(fn)  # type: ignore[misc]
    what = f"numpy random {name}()"
    if frame.tracer.scopes:
        raise GraphBreak(f"{what} inside a torch.cond branch")
    if owner is None and fn in _MAKERS:
        # built at capture, one object would be reused (its state carried over) by every call
        raise GraphBreak(f"making a NumPy generator ({name}) inside compiled code",
                         "it runs in Python on every call; its draws after the break are graph inputs")
    if owner is None or name in _BREAKS or name.startswith("_"):
        raise GraphBreak(f"{what} reads, writes or hands out generator state", "it runs in Python between graphs")
    owner_src = _GLOBAL if owner is np.random.mtrand._rand else frame.tracer.source_of.get(id(owner))
    if owner_src is None:
        raise GraphBreak(f"{what} on a generator made inside compiled code", "it runs in Python between graphs")
    text = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
    if any(t is None for t in text):
        raise GraphBreak(f"{what} with an argument that is not a constant (an array, a tensor, a symbolic size)",
                         "it runs in Python between graphs")
    expr = f"{owner_src}.{name}({', '.join(text)})"  # type: ignore[arg-type]
    if name in _SEEDS:
        if fn is np.random.seed:
            expr = f"__import__('numpy').random.seed({', '.join(text)})"  # type: ignore[arg-type]
        effect = fn if fn is np.random.seed else getattr(owner, name)
        frame.tracer.rng_pending = (*frame.tracer.rng_pending, (effect, list(args), dict(kwargs), expr))
        return None
    example = _example(owner, name, args, kwargs, what)
    before = [e for *_, e in frame.tracer.rng_pending]
    source = f"({', '.join([*before, expr])},)[-1]" if before else expr
    frame.tracer.rng_pending = ()
    if isinstance(example, np.ndarray):
        fake = frame.tracer.lift_draw(torch.from_numpy(example), f"__import__('torch').from_numpy({source})")
        return NumpyArray(frame.tracer.on_numpy_device(fake))
    if isinstance(example, np.generic):  # ``rng.integers(0, 10)``: a NumPy scalar
        fake = frame.tracer.lift_draw(torch.from_numpy(np.array(example)),
                                      f"__import__('torch').from_numpy(__import__('numpy').array({source}))")
        return NumpyArray(frame.tracer.on_numpy_device(fake), scalar=True)
    kind = type(example)  # a Python float/int/bool: exact as a 0-d float64/int64/bool tensor
    dtype = _PYTHON_DTYPES[kind]
    fake = frame.tracer.lift_draw(torch.tensor(example, dtype=dtype),
                                  f"__import__('torch').tensor({source}, dtype=__import__('torch').{_name(dtype)})")
    return NumpyArray(fake, scalar=True, python=kind)


_PYTHON_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _example(owner: Any, name: str, args: list, kwargs: dict, what: str) -> Any:
    """The same call on a scratch generator of the same kind: shape and dtype (or the Python type of
    a scalar), no state touched."""
    scratch = np.random.default_rng(0) if isinstance(owner, np.random.Generator) else np.random.RandomState(0)
    try:
        out = getattr(scratch, name)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - eager raises the same error when the call runs in Python
        raise GraphBreak(f"{what} failed on a scratch generator ({type(e).__name__}: {e})",
                         "it runs in Python between graphs") from e
    if type(out) in _PYTHON_DTYPES:
        if type(out) is int and not -2**63 <= out < 2**63:
            raise GraphBreak(f"{what} returns an int beyond int64", "it runs in Python between graphs")
        return out
    if not isinstance(out, (np.ndarray, np.generic)):
        raise GraphBreak(f"{what} returns a {type(out).__name__}, not an array or a number",
                         "it runs in Python between graphs")
    if not liftable(np.array(out) if isinstance(out, np.generic) else out):
        raise GraphBreak(f"{what} gives dtype {out.dtype}, which has no tensor dtype")
    return out


def _literal(v: Any) -> str | None:
    """Python source text that evaluates to ``v`` (constants only), or None."""
    if v is None or type(v) in (bool, int, str):
        return repr(v)
    if type(v) is float:
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, np.generic) and np.ndim(v) == 0 and v.dtype.kind in "biuf":
        return f"__import__('numpy').{v.dtype.name}({v.item()!r})"
    if type(v) in (tuple, list):
        maybe = [_literal(x) for x in v]
        parts = [p for p in maybe if p is not None]
        if len(parts) != len(maybe):
            return None
        inner = ", ".join(parts) + ("," if type(v) is tuple and len(parts) == 1 else "")
        return f"({inner})" if type(v) is tuple else f"[{inner}]"
    if isinstance(v, type) and issubclass(v, (np.generic, bool, int, float)) or isinstance(v, np.dtype):
        return f"__import__('numpy').dtype({np.dtype(v).str!r})"
    return None


def flush_pending(frame_tracer: Any) -> list[tuple[Any, list, dict]]:
    """Seeds no draw of the graph followed: replayed after the graph (exact: nothing after them in
    this graph draws)."""
    out = [(fn, args, kwargs) for fn, args, kwargs, _ in frame_tracer.rng_pending]
    frame_tracer.rng_pending = ()
    return out


# ---- Python numbers drawn per call --------------------------------------------------------------
# Note: ``np.random.rand()`` returns a Python float, which NumPy and torch treat as a weak scalar
# (``float32_array + r`` stays float32). The draw is held as a 0-d float64/int64/bool tensor that
# only operators use, each with the same result type and value as Python, NumPy or torch gives for
# the Python number, restricted to the cases where that holds exactly: + - * / // % and comparisons
# with numbers, arrays (NumPy's weak-scalar promotion) and float32/float64 (int64 too for an int)
# tensors. Everything else breaks the graph and runs in Python on the drawn value (``float(r)``,
# ``if r < 0.5``, ``np.exp(r)``, ``r ** 2``, a division by an int draw or of two numbers, which can
# raise in Python). Int results are assumed to stay within int64.
_NOT_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                operator.imod: operator.mod}
_ARITH = frozenset({operator.add, operator.sub, operator.mul})
_DIVIDE = frozenset({operator.truediv, operator.floordiv, operator.mod})
_COMPARE = frozenset({operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge})
_NUMBERS = (bool, int, float)
_RUNS = "it runs in Python on the drawn value"
_TENSOR_DTYPES = {float: (torch.float32, torch.float64), int: (torch.int64, torch.float32, torch.float64)}
_ARRAY_KINDS = {float: "biuf", int: "bf", bool: "biuf"}  # an int draw with an int array only when int64


def is_python_draw(v: Any) -> bool:
    return isinstance(v, NumpyArray) and v.python is not None


def python_operator(frame: Frame, op: Any, args: list, apply: Callable[[Frame, Any, list], Any]) -> Any:
    """An operator with a Python number drawn by NumPy's RNG among its operands (see the note above);
    ``apply`` records an operator on tensors (semantics.apply_operator)."""
    name = getattr(op, "__name__", "operator")
    if len(args) == 1:
        (a,) = args
        if op in (operator.neg, operator.pos) and a.python is not bool:
            return NumpyArray(apply(frame, op, [a.t]), scalar=True, python=a.python)
        raise GraphBreak(f"{name} of a number drawn by numpy random", _RUNS)
    a, b = args
    if is_python_draw(a) or type(a) in _NUMBERS:
        op = _NOT_INPLACE.get(op, op)  # a Python number is immutable: ``r += 1`` rebinds r
    base = _NOT_INPLACE.get(op, op)
    if base not in _ARITH | _DIVIDE | _COMPARE:
        raise GraphBreak(f"{name} with a number drawn by numpy random", _RUNS)
    draw = a if is_python_draw(a) else b
    other = b if draw is a else a
    if base in _DIVIDE and is_python_draw(b) and (b.python is not float or not isinstance(other, (NumpyArray, torch.Tensor))):
        raise GraphBreak(f"{name} by a number drawn by numpy random (a zero divisor raises in Python)", _RUNS)
    if type(other) in _NUMBERS or is_python_draw(other):
        return _number_op(frame, base, a, b, apply)
    if isinstance(other, NumpyArray):  # an array or a NumPy scalar: NumPy's weak-scalar promotion
        dt = NUMPY_OF[other.t.dtype]
        if dt.kind not in _ARRAY_KINDS[draw.python] and not (draw.python is int and dt == np.int64):
            raise GraphBreak(f"{name} of a {draw.python.__name__} drawn by numpy random and a {dt} array",
                             _RUNS)
        return binary(frame, op, a, b)
    if isinstance(other, torch.Tensor) and other.dtype in _TENSOR_DTYPES.get(draw.python, ()):
        return apply(frame, op, [draw.t if v is draw else v for v in (a, b)])
    what = f"{str(other.dtype).removeprefix('torch.')} tensor" if isinstance(other, torch.Tensor) else \
        type(other).__name__
    raise GraphBreak(f"{name} of a number drawn by numpy random and a {what}", _RUNS)


def _number_op(frame: Frame, op: Any, a: Any, b: Any, apply: Callable[[Frame, Any, list], Any]) -> Any:
    """Python arithmetic on drawn numbers and constants, in float64 or int64 as Python computes it."""
    kinds = {v.python if is_python_draw(v) else type(v) for v in (a, b)}
    floats = float in kinds
    for v in (a, b):
        if type(v) is int and not -2**31 < v < 2**31:
            raise GraphBreak("arithmetic of a number drawn by numpy random with a large int", _RUNS)
    if op in _DIVIDE and type(b) in _NUMBERS and b == 0:
        raise GraphBreak("division of a number drawn by numpy random by zero", _RUNS)
    compute = torch.float64 if floats or op is operator.truediv else torch.int64
    result: type = bool if op in _COMPARE else float if compute is torch.float64 else int
    ts = [cast(frame, v.t, NUMPY_OF[compute]) if is_python_draw(v) else v for v in (a, b)]
    return NumpyArray(apply(frame, op, ts), scalar=True, python=result)
