"""Symbolic float scalars: a SymFloat (``1.0 / x.shape[0]``, ``math.sqrt(d)``) as a loop-body value.

Note (how a float computed from sizes reaches a kernel): torch traces Python float arithmetic on
sizes as a sympy expression (``FloatTrueDiv(1.0, ToFloat(s0))``). kiln keeps it as a float64
loop-body expression over the kernel's size arguments (``IndexValue`` of a size symbol, cast to
float64), built with the same operations in the same order, so the kernel computes the double the
Python program computed — true division, ``+ - *`` and square roots are correctly rounded in IEEE
double on every backend — and then casts it to the op's compute dtype, as ATen casts a double
scalar. The body is loop-invariant: C++ compilers hoist it, Triton computes it on scalars once per
program. An extern (ATen) call that takes the scalar gets it computed by the wrapper in Python
(``python_scalar``) from the same expression. Expressions outside this vocabulary (``exp`` of a size,
an unbacked float...) raise DynamicShapeUnsupported: the graph runs as ATen.

A float argument that varies (a learning rate: capture's float symbol ``zf0``) is a leaf of the same
expressions: ``IndexValue(zf0, float64)``, the kernel's double argument (ir/sizes.py), so ``-lr``,
``lr / (1 - beta ** 2)`` and ``lr * x`` compute in the kernel from the value of each call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch

from .expr import Cast, Constant, Expr, IndexValue, Op, cast, format_expr, op
from .index import DynamicShapeUnsupported, to_kiln
from .sizes import float_symbol, is_float_symbol

F64 = torch.float64

# torch's sympy functions whose value is a float (torch.utils._sympy.functions), by class name
_FLOAT_FUNCTIONS = frozenset({"ToFloat", "FloatTrueDiv", "IntTrueDiv", "FloatPow", "OpaqueUnaryFn_sqrt"})
# sympy operations on floats -> the loop-body op computing them in float64
_BINARY = {"FloatTrueDiv": "truediv", "IntTrueDiv": "truediv", "FloatPow": "pow", "Pow": "pow",
           "Max": "maximum", "Min": "minimum"}
_UNARY = {"OpaqueUnaryFn_sqrt": "sqrt"}
_TO_INT = frozenset({"FloorToInt", "CeilToInt", "TruncToInt"})


@dataclass(frozen=True, slots=True)
class SymScalar:
    """A symbolic float scalar: ``value`` is a float64 loop-body expression over size symbols."""

    value: Expr

    def as_text(self) -> str:
        return format_expr(self.value)


def sym_scalar(v: torch.SymFloat) -> SymScalar:
    """A SymFloat as a float64 loop-body value (DynamicShapeUnsupported for what has none)."""
    return SymScalar(_float(v.node.expr))


def _is_int(e: sympy.Expr) -> bool:
    """An integer size expression (no float function or float number inside it)."""
    return not e.has(sympy.Float) and not any(is_float_symbol(x.name) for x in e.free_symbols) \
        and not any(type(a).__name__ in _FLOAT_FUNCTIONS for a in sympy.preorder_traversal(e))


def _size(e: sympy.Expr) -> Expr:
    return cast(IndexValue(to_kiln(e), torch.int64), F64)


def _float(e: sympy.Expr) -> Expr:
    if e.is_number:
        if not e.is_real:
            raise DynamicShapeUnsupported(f"symbolic float {e} is not a real number")
        return Constant(float(e), F64)
    if isinstance(e, sympy.Symbol) and is_float_symbol(e.name):  # a float argument: the kernel's double
        return IndexValue(float_symbol(e.name), F64)
    name = type(e).__name__
    if _is_int(e) or name in _TO_INT:  # an int size expression, floor(1.5 * s0) included (DerivedSize)
        return _size(e)
    if name == "ToFloat":
        return _size(e.args[0])
    if name in _UNARY:
        return op(_UNARY[name], _float(e.args[0]), dtype=F64)
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and 2 <= int(e.exp) <= 8:  # ``f * f``: sympy's f**2
        base = _float(e.base)
        acc = base
        for _ in range(int(e.exp) - 1):
            acc = op("mul", acc, base, dtype=F64)
        return acc
    if name in _BINARY and len(e.args) == 2:
        return op(_BINARY[name], _float(e.args[0]), _float(e.args[1]), dtype=F64)
    if isinstance(e, (sympy.Add, sympy.Mul)):  # left to right over sympy's (canonical) argument order
        fn = "add" if isinstance(e, sympy.Add) else "mul"
        acc = _float(e.args[0])
        for a in e.args[1:]:
            acc = op(fn, acc, _float(a), dtype=F64)
        return acc
    raise DynamicShapeUnsupported(f"symbolic float {e} ({name}) is not modelled by kiln.inductor")


# loop-body op -> its Python form over the operands' Python text (the wrapper computes with these)
_PYTHON: dict[str, Callable[..., str]] = {
    "add": lambda a, b: f"({a} + {b})", "sub": lambda a, b: f"({a} - {b})", "mul": lambda a, b: f"({a} * {b})",
    "truediv": lambda a, b: f"({a} / {b})", "pow": lambda a, b: f"({a} ** {b})",
    "maximum": lambda a, b: f"max({a}, {b})", "minimum": lambda a, b: f"min({a}, {b})",
    "sqrt": lambda a: f"math.sqrt({a})", "neg": lambda a: f"(-{a})",
}


def python_scalar(s: SymScalar, size: Callable[[sympy.Expr], str]) -> str:
    """``s`` as a Python float expression; ``size`` prints an integer size expression."""
    def go(e: Expr) -> str:
        if isinstance(e, Constant):
            return repr(float(e.value))
        if isinstance(e, Cast) and isinstance(e.x, IndexValue) and e.dtype == F64:
            return f"float({size(e.x.index)})"
        if isinstance(e, IndexValue) and e.dtype == F64:  # a float argument
            return f"float({size(e.index)})"
        if isinstance(e, Op) and e.name in _PYTHON:
            return _PYTHON[e.name](*(go(a) for a in e.args))
        raise DynamicShapeUnsupported(f"symbolic float {format_expr(s.value)} has no Python form here")
    return go(s.value)
