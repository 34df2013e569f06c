"""Emit loop-body expressions as C++: index math, ops, casts, common-subexpression temporaries."""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch

from ...ir import Cast, Constant, Expr, FloorDiv, IndexValue, Load, ModIndex, Op, index_var, walk
from .types import constant, ctype


def cindex(e: sympy.Expr) -> str:
    """An int64 C++ expression for a sympy index."""
    if isinstance(e, sympy.Integer):
        v = int(e)
        return f"{v}LL" if abs(v) > 2**31 - 1 else str(v)
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, sympy.Add):
        parts = [cindex(a) for a in sorted(e.args, key=sympy.default_sort_key)]
        return "(" + " + ".join(parts) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(cindex(a) for a in e.args) + ")"
    if isinstance(e, FloorDiv):
        return f"({cindex(e.args[0])} / {cindex(e.args[1])})"
    if isinstance(e, ModIndex):
        return f"({cindex(e.args[0])} % {cindex(e.args[1])})"
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
        return "(" + " * ".join([cindex(e.base)] * int(e.exp)) + ")"
    if isinstance(e, (sympy.Max, sympy.Min)):  # symbolic sizes (a convolution's output size)
        fn = "std::max<int64_t>" if isinstance(e, sympy.Max) else "std::min<int64_t>"
        out = cindex(e.args[0])
        for a in e.args[1:]:
            out = f"{fn}({out}, {cindex(a)})"
        return out
    raise NotImplementedError(f"index expression {e} ({type(e).__name__}) has no C++ form")


_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||", "logical_xor": "!=",
          "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}
_STD1 = {n: f"std::{n}" for n in ("exp exp2 expm1 log log2 log10 log1p sqrt sin cos tan asin acos atan sinh "
                                   "cosh tanh asinh acosh atanh erf erfc floor ceil trunc lgamma abs").split()}
_STD1["round"] = "std::nearbyint"
_HELPER1 = {"sigmoid": "kiln_sigmoid", "sign": "kiln_sign", "relu": "kiln_relu"}
_HELPER2 = {"maximum": "kiln_max", "minimum": "kiln_min", "floordiv": "kiln_floordiv",
            "truncdiv": "kiln_truncdiv", "mod": "kiln_mod", "fmod": "kiln_fmod", "pow": "kiln_pow",
            "lshift": "kiln_shl", "rshift": "kiln_shr", "atan2": "std::atan2", "copysign": "std::copysign", "hypot": "std::hypot"}


def _calc_type(d: torch.dtype) -> str:
    """C++ type a value of dtype ``d`` is computed in (bf16 travels as bits, converted by casts)."""
    return ctype(d)


def op_call(e: Op, a: list[str]) -> str:
    n = e.name
    argd = e.args[0].dtype if e.args else e.dtype
    t = _calc_type(argd)
    if n in _INFIX:
        return f"({a[0]} {_INFIX[n]} {a[1]})"
    if n in _STD1:
        if n == "abs" and not argd.is_floating_point:
            return f"({t})std::abs({a[0]})" if argd != torch.bool else a[0]
        return f"{_STD1[n]}({a[0]})"
    if n in _HELPER1:
        return f"{_HELPER1[n]}<{t}>({a[0]})"
    if n in _HELPER2:
        if n in ("atan2", "copysign", "hypot"):
            return f"{_HELPER2[n]}({a[0]}, {a[1]})"
        return f"{_HELPER2[n]}<{t}>({a[0]}, {a[1]})"
    simple = {
        "neg": f"(-{a[0]})" if argd != torch.bool else a[0], "square": f"({a[0]} * {a[0]})",
        "rsqrt": f"({t}(1) / std::sqrt({a[0]}))", "reciprocal": f"({t}(1) / {a[0]})",
        "frac": f"({a[0]} - std::trunc({a[0]}))",
        "isnan": f"({a[0]} != {a[0]})" if argd.is_floating_point else "false",
        "isinf": f"std::isinf({a[0]})" if argd.is_floating_point else "false",
        "isfinite": f"std::isfinite({a[0]})" if argd.is_floating_point else "true",
        "logical_not": f"(!{a[0]})", "bitwise_not": f"(~{a[0]})",
    }
    if n in simple:
        return simple[n]
    if n == "where":
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if n in ("check_index", "check_index_nonneg"):
        return f"kiln_{n}({a[0]}, {a[1]})"
    if n == "rand":
        return f"kiln_rand({a[0]}, {a[1]})"
    if n == "randn":
        return f"kiln_randn({a[0]}, {a[1]})"
    raise NotImplementedError(f"op {n} has no C++ implementation")


def cast_call(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    if src == dst:
        return x
    if src == torch.bfloat16:
        return cast_call(f"kiln_bf16_to_f32({x})", torch.float32, dst)
    if dst == torch.bfloat16:
        return f"kiln_f32_to_bf16({cast_call(x, src, torch.float32)})"
    if dst == torch.bool:
        return f"({x} != 0)"
    if src == torch.float16 and dst != torch.float32:
        return f"static_cast<{ctype(dst)}>(static_cast<float>({x}))"
    return f"static_cast<{ctype(dst)}>({x})"


class ExprEmitter:
    """Turns bodies into C++ statements appended to ``lines``; shared subtrees get one temporary.

    ``load_hook(load)`` may return a local name for loads the kernel keeps in registers.
    A ``where`` whose branches load memory (padding, cat) may not read out of range. Small branches
    are computed eagerly with every load *guarded*: it reads index ``cond ? idx : 0`` (always in
    range), and the select picks the right value. That keeps the loop vectorisable: emitted as C++
    ``?:`` around the loads, g++ ran a BN+ReLU+max-pool loop scalar with data-dependent branches, 20x
    slower (7 ms for ResNet's stem pool). Bigger branches, or ones an integer division could trap in,
    stay lazily evaluated inline.
    """

    def __init__(self, lines: list[str], indent: str, load_hook: Callable[[Load], str | None],
                 ptr_name: Callable[[str], str], counter: list[int]) -> None:
        self.lines, self.indent = lines, indent
        self.load_hook, self.ptr_name = load_hook, ptr_name
        self.cache: dict[tuple[str | None, Expr], str] = {}  # (guard, expr) -> temporary
        self.guard: str | None = None  # a C++ bool: loads emitted now read index 0 where it is false
        self.counter = counter
        # row kernels: values computed in one inner loop and reused by a later one (softmax's exp)
        self.row_cache_write: dict[Expr, str] = {}
        self.row_cache_read: dict[Expr, str] = {}

    def _tmp(self, text: str, d: torch.dtype) -> str:
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{self.indent}{_calc_type(d)} {name} = {text};")
        return name

    def emit(self, e: Expr) -> str:
        hit = self.cache.get((None, e)) or self.cache.get((self.guard, e))
        if hit is not None:
            return hit
        reuse = self.row_cache_read.get(e)
        if reuse is not None:
            return reuse
        out = self._emit(e, inline=False)
        self.cache[(self.guard, e)] = out
        slot = self.row_cache_write.get(e)
        if slot is not None and self.guard is None:
            self.lines.append(f"{self.indent}{slot} = {out};")
        return out

    def _guarded_where(self, e: Op) -> str:
        """Both branches computed, each under its condition as the guard of its loads (class doc)."""
        c = self.emit(e.args[0])
        values = []
        for br, cond in ((e.args[1], c), (e.args[2], f"(!{c})")):
            saved = self.guard
            if _has_memory_load(br, self.load_hook):
                self.guard = cond if saved is None else self._tmp(f"({saved} && {cond})", torch.bool)
            values.append(self.emit(br))
            self.guard = saved
        return self._tmp(f"({c} ? {values[0]} : {values[1]})", e.dtype)

    def inline(self, e: Expr) -> str:
        return self._emit(e, inline=True)

    def _emit(self, e: Expr, inline: bool) -> str:
        sub = self.inline if inline else self.emit
        if isinstance(e, Constant):
            return constant(e.value, e.dtype)
        if isinstance(e, IndexValue):
            return f"static_cast<{ctype(e.dtype)}>({cindex(e.index)})"
        if isinstance(e, Load):
            local = self.load_hook(e)
            if local is not None:
                return local
            index = e.index
            if e.indirect:
                binds = {}
                for k, a in enumerate(e.indirect):
                    v = sub(a)
                    if not v.isidentifier():
                        v = self._tmp(v, torch.int64) if not inline else f"({v})"
                    binds[index_var("d", k)] = sympy.Symbol(v, integer=True)
                index = index.xreplace(binds)
            at = cindex(index) if self.guard is None else f"({self.guard} ? {cindex(index)} : 0)"
            text = f"{self.ptr_name(e.buffer)}[{at}]"
            return text if inline else self._tmp(text, e.dtype)
        if isinstance(e, Cast):
            text = cast_call(sub(e.x), e.x.dtype, e.dtype)
            return text if inline else self._tmp(text, e.dtype)
        assert isinstance(e, Op)
        if e.name == "where" and any(_has_memory_load(br, self.load_hook) for br in e.args[1:]):
            if not inline and _eager_branches_ok(e):
                return self._guarded_where(e)
            c = sub(e.args[0])
            text = f"({c} ? {self.inline(e.args[1])} : {self.inline(e.args[2])})"
            return text if inline else self._tmp(text, e.dtype)
        args = [sub(a) for a in e.args]
        text = op_call(e, args)
        return text if inline else self._tmp(text, e.dtype)


_TRAPPING = {"floordiv", "truncdiv", "mod", "fmod", "truediv", "pow"}  # may trap or loop on integers
EAGER_WHERE_MAX_NODES = 96
EAGER_WHERE_MAX_LOADS = 12


def _has_memory_load(e: Expr, load_hook: Callable[[Load], str | None]) -> bool:
    return any(isinstance(n, Load) and load_hook(n) is None for n in walk(e))


def _eager_branches_ok(e: Op) -> bool:
    """Whether both branches of a ``where`` are small and safe to compute where they are not taken."""
    nodes = [n for br in e.args[1:] for n in walk(br)]
    if len(nodes) > EAGER_WHERE_MAX_NODES or sum(isinstance(n, Load) for n in nodes) > EAGER_WHERE_MAX_LOADS:
        return False
    for n in nodes:
        if isinstance(n, Op) and (n.name in ("rand", "randn", "check_index", "check_index_nonneg") or (
                n.name in _TRAPPING and not all(a.dtype.is_floating_point for a in n.args))):
            return False
    return True
