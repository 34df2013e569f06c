"""The loop IR's op vocabulary (``OPS``) as Triton expressions, and dtype handling.

Values in a kernel are held in their *compute* dtype: bf16/fp16 live in fp32 registers (loaded then
upcast; rounded back only where the program casts to them and when stored), everything else as is.
Each emitter gets operand code already converted to the op's operand type and returns code whose
Triton dtype is the compute dtype of the op's result.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence

import torch

from ...ir import OPS

HALF = (torch.float16, torch.bfloat16)

TL_DTYPE: dict[torch.dtype, str] = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def tl_dtype(d: torch.dtype) -> str:
    try:
        return TL_DTYPE[d]
    except KeyError:
        raise NotImplementedError(f"the Triton backend does not support dtype {d}") from None


def compute_dtype(d: torch.dtype) -> torch.dtype:
    """The register type a value of IR dtype ``d`` is kept in."""
    return torch.float32 if d in HALF else d


def convert(code: str, src: torch.dtype, dst: torch.dtype) -> str:
    """Code converting a value held for IR dtype ``src`` into one held for IR dtype ``dst``.

    Casting into a half type rounds (the program asked for it), then keeps the value in fp32.
    """
    if src == dst:
        return code
    if dst == torch.bool:
        return f"({code} != 0)"
    if dst == torch.bfloat16:
        return f"_kiln_round_bf16({convert(code, src, torch.float32)})"
    if dst in HALF:
        return f"{code}.to({tl_dtype(dst)}).to(tl.float32)"
    if compute_dtype(src) == compute_dtype(dst):
        return code
    return f"{code}.to({tl_dtype(dst)})"


def literal(value: bool | int | float, dtype: torch.dtype) -> str:
    """A 0-d tensor constant of compute dtype (typed, so it never widens neighbouring operands)."""
    if dtype == torch.bool:
        return f"tl.full([], {int(bool(value))}, tl.int1)"
    if dtype.is_floating_point:
        v = float(value)
        text = repr(v) if v == v and v not in (float("inf"), float("-inf")) else f'float("{v}")'
        return f"tl.full([], {text}, {tl_dtype(compute_dtype(dtype))})"
    # wrapped into the dtype's range as eager converts a scalar (uint8 x + -3 adds 253); Triton rejects -3 as uint8
    bits = dtype.itemsize * 8
    v = int(value) % (1 << bits)
    if dtype.is_signed and v >= 1 << (bits - 1):
        v -= 1 << bits
    return f"tl.full([], {v}, {tl_dtype(dtype)})"


Emitter = Callable[[list[str], torch.dtype], str]  # (operand code, operand dtype) -> code


def _fn(name: str) -> Emitter:
    return lambda a, d: f"{name}({', '.join(a)})"


def _floordiv(a: list[str], d: torch.dtype) -> str:
    x, y = a
    if d.is_floating_point:
        return f"_kiln_floordiv_float({x}, {y})"
    # Triton's // and % truncate toward zero; torch floors
    return f"({x} // {y} - (({x} % {y} != 0) & (({x} < 0) != ({y} < 0))).to({tl_dtype(d)}))"


def _truncdiv(a: list[str], d: torch.dtype) -> str:
    x, y = a
    return f"libdevice.trunc({x} / {y})" if d.is_floating_point else f"({x} // {y})"


def _mod(a: list[str], d: torch.dtype) -> str:
    x, y = a
    r = f"libdevice.fmod({x}, {y})" if d.is_floating_point else f"({x} % {y})"
    return f"_kiln_python_mod({r}, {y})"


def _fmod(a: list[str], d: torch.dtype) -> str:
    x, y = a
    return f"libdevice.fmod({x}, {y})" if d.is_floating_point else f"({x} % {y})"


def _extremum(cmp: str, fallback: str) -> Emitter:
    def emit(a: list[str], d: torch.dtype) -> str:
        x, y = a
        if d.is_floating_point:  # NaN propagates, as in torch
            return f"tl.where(({x} {cmp} {y}) | ({x} != {x}), {x}, {y})"
        return f"{fallback}({x}, {y})"
    return emit


def _shift(sym: str) -> Emitter:
    # a count outside [0, bits) shifts everything out as in torch (<< gives 0, >> the sign); LLVM leaves it undefined
    def emit(a: Sequence[str], d: torch.dtype) -> str:
        x, y = a
        bits = d.itemsize * 8
        ok = f"(({y} >= 0) & ({y} < {bits}))"
        shifted = f"({x} {sym} tl.where({ok}, {y}, 0))"
        out = f"({x} >> {bits - 1})" if sym == ">>" and d.is_signed else "0"
        return f"tl.where({ok}, {shifted}, {out})"
    return emit


def _add(a: list[str], d: torch.dtype) -> str:
    # bool + bool is logical or in torch; Triton's int1 add wraps (True + True is False)
    return f"({a[0]} | {a[1]})" if d == torch.bool else f"({a[0]} + {a[1]})"


def _sign(a: list[str], d: torch.dtype) -> str:
    x = a[0]
    if d == torch.bool:
        return x
    t = tl_dtype(d)
    return f"(({x} > 0).to({t}) - ({x} < 0).to({t}))"  # sign(NaN) is 0 in torch


def _pow(a: list[str], d: torch.dtype) -> str:
    x, y = a
    if d.is_floating_point:
        return f"libdevice.pow({x}, {y})"
    if d == torch.bool:
        return f"libdevice.pow({x}.to(tl.float64), {y}.to(tl.float64)).to({tl_dtype(d)})"
    return f"_kiln_ipow({x}, {y}, {d.itemsize * 8})"


def _isinf(a: list[str], d: torch.dtype) -> str:
    return f"(tl.abs({a[0]}) == float(\"inf\"))" if d.is_floating_point else f"({a[0]} != {a[0]})"


def _isfinite(a: list[str], d: torch.dtype) -> str:
    x = a[0]
    return f"(({x} == {x}) & (tl.abs({x}) != float(\"inf\")))" if d.is_floating_point else f"({x} == {x})"


def _abs(a: list[str], d: torch.dtype) -> str:
    return a[0] if d == torch.bool else f"tl.abs({a[0]})"


def _neg(a: list[str], d: torch.dtype) -> str:
    return f"(-{a[0]})"


def _bitwise_not(a: list[str], d: torch.dtype) -> str:
    return f"({a[0]} == 0)" if d == torch.bool else f"(~{a[0]})"


_INT_LITERAL = re.compile(r"^tl\.full\(\[\], (-?\d+), tl\.u?int(?:8|16|32|64)\)$")
_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}


def _binop(sym: str) -> Emitter:
    def emit(a: Sequence[str], d: torch.dtype) -> str:
        # a comparison of two integer constants (a cat's branch test at a fixed index) is folded: the
        # interpreter cannot use a 0-d comparison result in a load mask
        lhs, rhs = _INT_LITERAL.match(a[0]), _INT_LITERAL.match(a[1])
        if sym in _COMPARE and lhs and rhs:
            return literal(_COMPARE[sym](int(lhs.group(1)), int(rhs.group(1))), torch.bool)
        return f"({a[0]} {sym} {a[1]})"
    return emit


# Emitters keyed by op name. Operands arrive converted to OPERAND_DTYPE's choice (see kernel.py).
EMITTERS: dict[str, Emitter] = {
    # math: float operands (fp32 for half types)
    "exp": _fn("tl.exp"), "exp2": _fn("tl.exp2"), "expm1": _fn("libdevice.expm1"), "log": _fn("tl.log"),
    "log2": _fn("tl.log2"), "log10": _fn("libdevice.log10"), "log1p": _fn("libdevice.log1p"),
    "sqrt": _fn("tl.sqrt"), "rsqrt": _fn("libdevice.rsqrt"), "sin": _fn("tl.sin"), "cos": _fn("tl.cos"),
    "tan": _fn("libdevice.tan"), "asin": _fn("libdevice.asin"), "acos": _fn("libdevice.acos"),
    "atan": _fn("libdevice.atan"), "sinh": _fn("libdevice.sinh"), "cosh": _fn("libdevice.cosh"),
    "tanh": _fn("libdevice.tanh"), "asinh": _fn("libdevice.asinh"), "acosh": _fn("libdevice.acosh"),
    "atanh": _fn("libdevice.atanh"), "erf": _fn("tl.erf"), "erfc": _fn("libdevice.erfc"),
    "sigmoid": _fn("tl.sigmoid"), "reciprocal": lambda a, d: f"(1.0 / {a[0]})", "floor": _fn("tl.floor"),
    "ceil": _fn("tl.ceil"), "trunc": _fn("libdevice.trunc"), "round": _fn("libdevice.nearbyint"),
    "frac": lambda a, d: f"({a[0]} - libdevice.trunc({a[0]}))", "lgamma": _fn("libdevice.lgamma"),
    "pow": _pow, "atan2": _fn("libdevice.atan2"), "copysign": _fn("libdevice.copysign"),
    "hypot": _fn("libdevice.hypot"),
    # arithmetic
    "neg": _neg, "abs": _abs, "sign": _sign, "square": lambda a, d: f"({a[0]} * {a[0]})",
    "relu": lambda a, d: f"tl.where({a[0]} < 0, 0, {a[0]})",
    "add": _add, "sub": _binop("-"), "mul": _binop("*"), "truediv": _binop("/"),
    "floordiv": _floordiv, "truncdiv": _truncdiv, "mod": _mod, "fmod": _fmod,
    "maximum": _extremum(">", "tl.maximum"), "minimum": _extremum("<", "tl.minimum"),
    # comparisons (operands share one dtype) -> bool
    "eq": _binop("=="), "ne": _binop("!="), "lt": _binop("<"), "le": _binop("<="), "gt": _binop(">"),
    "ge": _binop(">="),
    "isnan": lambda a, d: f"({a[0]} != {a[0]})", "isinf": _isinf, "isfinite": _isfinite,
    # logical: operands as bool
    "logical_and": _binop("&"), "logical_or": _binop("|"), "logical_xor": _binop("^"),
    "logical_not": lambda a, d: f"({a[0]} == 0)",
    # bitwise
    "bitwise_and": _binop("&"), "bitwise_or": _binop("|"), "bitwise_xor": _binop("^"),
    "lshift": _shift("<<"), "rshift": _shift(">>"), "bitwise_not": _bitwise_not,
    # select: (bool, value, value)
    "where": lambda a, d: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    # an index loaded from a tensor: negative ones count from the end. Not checked against the size here
    # (the C++ backend raises eager's IndexError; a device assert compiles only in Triton's debug mode)
    "check_index": lambda a, d: f"tl.where({a[0]} < 0, {a[0]} + {a[1]}, {a[0]})",
    "check_index_nonneg": lambda a, d: a[0],
    # counter-based random numbers: (seed scalar, int offset) -> float32 in [0, 1) / standard normal
    "rand": lambda a, d: f"tl.rand({a[0]}, ({a[1]}).to(tl.uint32))",
    "randn": lambda a, d: f"tl.randn({a[0]}, ({a[1]}).to(tl.uint32))",
}


def _kind(name: str, out: torch.dtype) -> str:
    # an integer pow is integer arithmetic (_kiln_ipow), not float math: through float it was inexact past 2**24
    # and saturated where eager wraps
    return "arith" if name == "pow" and not out.is_floating_point else OPS[name].kind


def operand_dtypes(name: str, arg_dtypes: list[torch.dtype], out: torch.dtype) -> list[torch.dtype]:
    """The IR dtype each operand is converted to before the op is applied."""
    kind = _kind(name, out)
    if kind == "math":
        t = out if out.is_floating_point else torch.float32
        return [t] * len(arg_dtypes)
    if kind in ("arith", "bitwise"):
        return [out] * len(arg_dtypes)
    if kind == "compare":
        common = arg_dtypes[0]
        for d in arg_dtypes[1:]:
            common = torch.promote_types(common, d)
        return [common] * len(arg_dtypes)
    if kind == "logical":
        return [torch.bool] * len(arg_dtypes)
    if kind == "select":
        return [torch.bool, out, out]
    if kind == "random":
        return [torch.int64, torch.int64]
    raise NotImplementedError(f"op kind {kind!r} of {name!r}")


def emit_op(name: str, args: list[str], operand_dtype: torch.dtype, out: torch.dtype) -> str:
    """Code for ``name(args)`` whose value has compute dtype of ``out``."""
    emitter = EMITTERS.get(name)
    if emitter is None:
        raise NotImplementedError(f"the Triton backend has no emitter for op {name!r}")
    code = emitter(args, operand_dtype)
    kind = _kind(name, out)
    if kind == "math" and not out.is_floating_point:
        code = f"{code}.to({tl_dtype(out)})"
    elif kind == "random" and out != torch.float32:
        code = convert(code, torch.float32, out)
    if out in HALF and kind not in ("compare", "logical"):
        code = convert(code, torch.float32, out)  # an op in a half type rounds like eager
    return code
