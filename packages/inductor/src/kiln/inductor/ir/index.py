"""Index expressions: sympy over loop variables, with integer floor-division and modulo that simplify.

Loop variables are integer, non-negative sympy symbols: ``i0, i1, ...`` for a node's iteration space,
``r0, r1, ...`` for its reduction space, ``x0, ...`` for a kernel's outer loops. Size symbols of
dynamic shapes (``s0``) appear alongside them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import sympy
import torch
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from kiln.graph import KilnError, SymbolicSizeError, py_expr

from .sizes import size_symbols_of

IndexExpr: TypeAlias = sympy.Expr


class DynamicShapeUnsupported(KilnError):
    """kiln.inductor cannot compile this graph with symbolic sizes (the reason says what); the caller
    compiles it again with static sizes."""


class FloorDiv(sympy.Function):
    """Integer floor division of non-negative index values (C's ``/`` on them)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if isinstance(base, sympy.Integer) and isinstance(divisor, sympy.Integer):
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if isinstance(base, sympy.Add):  # pull out terms that are exact multiples of the divisor
            exact = [t for t in base.args if _divisible(t, divisor)]
            rest = sympy.Add(*[t for t in base.args if not _divisible(t, divisor)])
            if exact and _rest_ok(rest, divisor):
                return sympy.Add(*[t / divisor for t in exact]) + FloorDiv(rest, divisor)
        if _divisible(base, divisor):
            return base / divisor
        return None


class ModIndex(sympy.Function):
    """``base % divisor`` for non-negative index values."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if divisor == 1 or base == 0:
            return sympy.Integer(0)
        if isinstance(base, sympy.Integer) and isinstance(divisor, sympy.Integer):
            return sympy.Integer(int(base) % int(divisor))
        if isinstance(base, sympy.Add):
            kept = [t for t in base.args if not _divisible(t, divisor)]
            if len(kept) != len(base.args) and _rest_ok(sympy.Add(*kept), divisor):
                return ModIndex(sympy.Add(*kept), divisor)
        if _divisible(base, divisor):
            return sympy.Integer(0)
        return None


def fold_divmod(index: sympy.Expr) -> sympy.Expr:
    """``c*n*(b // n) + c*(b % n)`` folded back to ``c*b`` in a sum. A reshape that splits a dim and
    one that merges it again (a [B*L, C] view of a [B, L, C] value, for a matmul) leave this pair;
    folded, the load reads ``768*x0`` as the producer stores it, so the two loops fuse (a LayerNorm and
    the normalised values it writes for the next matmul: one kernel, not two)."""
    if not isinstance(index, sympy.Add) or not index.has(ModIndex):
        return index
    while isinstance(index, sympy.Add):
        terms = index.as_coefficients_dict()
        for t, c in terms.items():
            if not isinstance(t, ModIndex):
                continue
            base, n = t.args
            q = FloorDiv(base, n)
            cq = terms.get(q)
            if cq is not None and cq == c * n:
                index = sympy.expand(index - c * t - cq * q + c * base)
                break
        else:
            break
    return index


def _rest_ok(rest: sympy.Expr, divisor: sympy.Expr) -> bool:
    """Whether the part left after pulling exact multiples out of a floor division / modulo stays a
    non-negative operand (printed as C's truncating ``/`` and ``%``). A symbolic divisor needs it proven:
    ``(s*s - 1 - i) // s`` must not become ``s + (-1 - i) // s``, which truncates to ``s`` in C
    (a flip over a symbolic size). A static divisor too where the rest holds a size symbol:
    ``(8 - n % 8) % 8`` (a pad to a multiple of 8) became ``(-(n % 8)) % 8``, negative in C, and every
    padded row was read from the wrong place. Rests over loop indices and constants alone keep the
    rule they always had (their negative values are the masked-out reads of padding and pooling)."""
    if isinstance(divisor, sympy.Integer) and not size_symbols_of(rest):
        return True
    return rest == 0 or bool(rest.is_nonnegative)


def _divisible(term: sympy.Expr, divisor: sympy.Expr) -> bool:
    q = term / divisor
    return bool(q.is_integer) if not isinstance(q, sympy.Rational) or q.q == 1 else False


@functools.cache
def index_var(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


def index_vars(prefix: str, n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(index_var(prefix, i) for i in range(n))


def walks_rows(indices: Iterator[IndexExpr], out_last: sympy.Symbol | None, red_last: sympy.Symbol) -> bool:
    """Whether a reduction's loads (``indices``) walk memory along its reduced range rather than across
    its outputs (a column reduction). Each load of a 2-D block (it uses the innermost output and the
    innermost reduced index) votes for the one of the two that has stride 1; loads of one row's or one
    column's vector broadcast over the other dim (LayerNorm's per-token mean and rstd in its weight
    gradient) do not vote; a tie counts as rows."""
    votes = 0
    for index in indices:
        free = index.free_symbols
        if red_last not in free or (out_last is not None and out_last not in free):
            continue
        ex = sympy.expand(index)
        if ex.coeff(red_last) == 1:
            votes += 1
        elif out_last is not None and ex.coeff(out_last) == 1:
            votes -= 1
    return votes >= 0


def as_index(v: object) -> sympy.Expr:
    if isinstance(v, sympy.Expr):
        return v
    if isinstance(v, torch.SymInt):  # never int(): that would specialise the size
        return sym_expr(v)
    return sympy.Integer(int(v))  # type: ignore[call-overload]


def is_dense(shape: Sequence[object], stride: Sequence[object]) -> bool:
    """Whether ``stride`` lays ``shape`` out densely (a permutation of contiguous strides). Symbolic
    sizes as sympy: provably dense for every size; SymInts: False (int() would specialise them)."""
    if not all(isinstance(x, (int, sympy.Integer)) for x in (*shape, *stride)):
        if not all(isinstance(x, (int, sympy.Expr)) for x in (*shape, *stride)):
            return False
        return _dense_symbolic(shape, stride)
    dims = sorted((int(st), int(sz)) for sz, st in zip(shape, stride) if int(sz) != 1)  # type: ignore[call-overload]
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _dense_symbolic(shape: Sequence[object], stride: Sequence[object]) -> bool:
    """Each next stride is the product of the sizes before it, in some order of the dims.

    A stride's ``Max(1, e)`` reads as ``e``: torch lays out contiguous strides over ``max(size, 1)``
    (a convolution's output, sized ``H - k + 1 + 2p``, has stride ``Max(1, H - k + 1 + 2p)``), and
    the two differ only when a size is 0, where the tensor has no element to lay out."""
    left = [(_without_max_one(sympy.sympify(st)), sympy.sympify(sz)) for sz, st in zip(shape, stride) if sz != 1]
    expect: sympy.Expr = sympy.Integer(1)
    while left:
        hit = next((p for p in left if sympy.expand(p[0] - expect) == 0), None)
        if hit is None:
            return False
        left.remove(hit)
        expect = sympy.expand(expect * hit[1])
    return True


def contiguous_strides(shape: Sequence[IndexExpr]) -> tuple[IndexExpr, ...]:
    strides: list[IndexExpr] = []
    acc: IndexExpr = sympy.Integer(1)
    for s in reversed(shape):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def strided_index(vars_: Sequence[IndexExpr], strides: Sequence[IndexExpr],
                  offset: IndexExpr = sympy.S.Zero) -> IndexExpr:
    return sympy.expand(offset + sum((v * s for v, s in zip(vars_, strides)), sympy.Integer(0)))


def product(xs: Sequence[IndexExpr]) -> IndexExpr:
    acc: IndexExpr = sympy.Integer(1)
    for x in xs:
        acc = acc * x
    return acc


def is_static(e: IndexExpr) -> bool:
    return isinstance(e, (int, sympy.Integer))


@functools.lru_cache(maxsize=65536)
def index_str(e: sympy.Expr) -> str:
    """A fast, stable text form of an index (sympy's printer is slow on large programs)."""
    if isinstance(e, sympy.Integer):
        return str(int(e))
    if isinstance(e, sympy.Symbol):
        return e.name
    if isinstance(e, sympy.Add):
        return " + ".join(index_str(a) for a in sorted(e.args, key=sympy.default_sort_key))
    if isinstance(e, sympy.Mul):
        return "*".join(f"({index_str(a)})" if isinstance(a, sympy.Add) else index_str(a) for a in e.args)
    if isinstance(e, (FloorDiv, ModIndex)):
        op = "//" if isinstance(e, FloorDiv) else "%"
        return f"({index_str(e.args[0])}){op}{index_str(e.args[1])}"
    return str(e)


# ---- symbolic sizes (ir/sizes.py says more) ----


@functools.cache
def size_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def is_symbolic(v: object) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not _is_constant(v)


def _is_constant(v: object) -> bool:
    try:
        return v.node.is_constant() or isinstance(v.node.expr, sympy.Number)  # type: ignore[attr-defined]
    except AttributeError:
        return False


def sym_expr(v: object) -> sympy.Expr:
    """An int or SymInt as a kiln index expression (DynamicShapeUnsupported for what has none)."""
    if isinstance(v, torch.SymInt):
        return to_kiln(v.node.expr)
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        raise DynamicShapeUnsupported(f"a symbolic {type(v).__name__} ({v}) is not modelled by kiln.inductor")
    if isinstance(v, sympy.Expr):
        return v
    return sympy.Integer(int(v))  # type: ignore[call-overload]


# Names of the size symbols of the graph being compiled whose ShapeEnv range starts at 1 or above
# (``positive_sizes``): a divisor over them alone is never 0.
_POSITIVE_SIZES: contextvars.ContextVar[tuple[frozenset[str], Any]] = contextvars.ContextVar(
    "kiln_positive_sizes", default=(frozenset(), None))


@contextlib.contextmanager
def positive_sizes(shape_env: Any) -> Iterator[None]:
    """While compiling a graph over ``shape_env``: its size symbols whose range the capture's guards
    keep at >= 1 (0 specialises; a dim that may be 1 has [1, inf)) count as positive divisors
    (``shift % s`` of ``torch.roll`` over a symbolic dim). Nothing changes without a ShapeEnv."""
    ranges = getattr(shape_env, "var_to_range", None) or {}
    names = frozenset(str(k) for k, r in ranges.items() if _lower_at_least_one(r))
    token = _POSITIVE_SIZES.set((names, shape_env))
    try:
        yield
    finally:
        _POSITIVE_SIZES.reset(token)


def _lower_at_least_one(r: Any) -> bool:
    try:
        return bool(r.lower >= 1)
    except TypeError:
        return False


def _positive(d: sympy.Expr, shape_env_form: sympy.Expr | None = None) -> bool:
    """``d`` is >= 1 for every size the compiled graph is called with: provably positive, positive
    once the graph's size symbols of range [1, inf) are taken as positive, or (``shape_env_form``: the
    divisor as the ShapeEnv spells it) >= 1 at the example's sizes, which the compile then assumes as
    a size guard (``s // 4 >= 1`` for a window partition's ``h // (h // 4)``): a call outside it fails
    the guard and recompiles, it never divides by zero."""
    if d.is_positive is True:
        return True
    known, env = _POSITIVE_SIZES.get()
    syms = [x for x in d.free_symbols if x.name in known]
    if syms and d.xreplace({x: sympy.Dummy(x.name, integer=True, positive=True)
                            for x in syms}).is_positive is True:
        return True
    if env is None or shape_env_form is None or not d.is_nonnegative:
        return False
    hints = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})  # renamed after torch 2.11
    try:
        at_example = shape_env_form.xreplace(hints)
        if not (at_example.is_Integer and at_example >= 1):
            return False  # no guard recorded for a divisor that is 0 at the example
        return bool(env.evaluate_expr(sympy.Ge(shape_env_form, 1)))
    except Exception:  # noqa: BLE001 - a form the ShapeEnv cannot evaluate: not provable
        return False


def _check_nonnegative_division(e: sympy.Expr, args: list[sympy.Expr]) -> None:
    """kiln's FloorDiv and ModIndex are C's ``/`` and ``%``, which agree with Python's ``//`` and ``%`` only
    for a non-negative dividend and a positive divisor; anything else (``(-s0) % 8``, a pad to a multiple)
    is refused rather than computed with C's truncating rounding."""
    dividend, divisors = args[0], args[1:]
    if dividend.is_nonnegative is not True or not all(_positive(d) for d in divisors):
        raise DynamicShapeUnsupported(f"size expression {e}: a division or remainder kiln.inductor cannot prove "
                                      "non-negative (C and Python round negative operands differently)")


def _dividend_shift(e: sympy.Expr, args: list[sympy.Expr]) -> int:
    """0 where the dividend is provably non-negative; else ``c`` such that dividend + c*divisor is
    non-negative for every size (sizes >= 0) and float argument (any sign: ``int(s) % n``). A convolution's output size ``(H + 2p - d*(k-1) - 1)//s + 1``
    divides ``H - 1`` (negative only for H = 0): ``(H - 1)//2`` is computed as ``(H + 1)//2 - 1``.
    A dividend without a lower bound, or a divisor not provably positive, is refused."""
    dividend, divisors = args[0], args[1:]
    forms = e.args[1:] if len(e.args) == len(args) else [None] * len(divisors)
    if not all(_positive(d, form) for d, form in zip(divisors, forms, strict=True)):
        raise DynamicShapeUnsupported(f"size expression {e}: a division or remainder by a divisor kiln.inductor "
                                      "cannot prove positive (C and Python round negative operands differently)")
    if dividend.is_nonnegative is True:
        return 0
    try:  # on the ShapeEnv's form, which bound_sympy knows (sizes range over [0, oo)); -oo: unbounded
        low = int(sympy.floor(bound_sympy(e.args[0], {x: _value_range(x) for x in e.args[0].free_symbols}).lower))
    except (TypeError, ValueError, OverflowError, AttributeError, NotImplementedError):
        raise DynamicShapeUnsupported(f"size expression {e}: a division or remainder kiln.inductor cannot prove "
                                      "non-negative (C and Python round negative operands differently)") from None
    return max(0, -low)


def _exact_quotient(a: sympy.Expr, b: sympy.Expr) -> tuple[sympy.Expr, sympy.Integer] | None:
    """``(p, c)`` with ``a / b == p / c`` as rational functions, ``p`` a polynomial with integer
    coefficients and ``c`` a positive integer, where the symbolic divisor ``b`` cancels (``(h*h) //
    (2*h)`` is ``h // 2``: ConvNeXt's reshapes of an (h, h) feature map, h = H // 4); else None. Then
    ``a // b == p // c`` for every ``b != 0`` whatever its sign; at ``b == 0`` torch's own size
    computation divides by zero, so no call reaches the graph there."""
    if isinstance(b, sympy.Integer) or not b.free_symbols:
        return None
    num, den = sympy.fraction(sympy.cancel(a / b))
    if not isinstance(den, sympy.Integer) or den <= 0:
        return None
    if not isinstance(num, sympy.Integer):
        try:
            poly = sympy.Poly(num)  # generators: the size symbols and integer functions of them
        except sympy.PolynomialError:
            return None
        if not all(g.is_integer for g in poly.gens) or not all(c.is_integer for c in poly.coeffs()):
            return None
    return sympy.expand(num), den


def _shifted_division(name: str, args: list[sympy.Expr], shift: int) -> sympy.Expr:
    """``a // b`` as ``(a + c*b) // b - c`` and ``a % b`` as ``(a + c*b) % b`` (exact for integers), with
    ``a + c*b >= 0``: ``c = shift`` covers every divisor >= 1."""
    a, b = args[0], args[1]
    if name == "CeilDiv":
        a = a + b - 1
    quotient = FloorDiv(a + shift * b, b) - shift
    if name in ("FloorDiv", "CleanDiv", "CeilDiv"):
        return quotient
    if name in ("Mod", "PythonMod"):
        return ModIndex(a + shift * b, b)
    # ModularIndexing(a, b, m) = (a // b) % m; the quotient >= -shift, so shift it by m the same way
    m = args[2]
    return ModIndex(quotient + shift * m, m)


def to_kiln(e: sympy.Expr) -> sympy.Expr:
    """A ShapeEnv expression in kiln's vocabulary (its symbols as size symbols, its FloorDiv and
    ModularIndexing as kiln's FloorDiv/ModIndex)."""
    if isinstance(e, sympy.Integer):
        return e
    if isinstance(e, sympy.Symbol):
        if e.name.startswith(("u", "zuf")):
            raise DynamicShapeUnsupported(f"data-dependent size {e.name} (an unbacked symbol) is not modelled "
                                          "by kiln.inductor")
        return size_symbol(e.name)
    name = type(e).__name__
    if name in ("CeilToInt", "FloorToInt", "TruncToInt") and type(e.args[0]).__name__ == "IntTrueDiv":
        # an int rounded from a true division of sizes (``math.ceil(n / 32)``): exact as integer division
        num, den = (to_kiln(a) for a in e.args[0].args)
        _check_nonnegative_division(e, [num, den])  # and then truncation is floor
        return FloorDiv(num + den - 1, den) if name == "CeilToInt" else FloorDiv(num, den)
    if name in _FLOAT_TO_INT:  # any other float rounded to a size: a derived size symbol
        return derived_size(e)
    args = [to_kiln(a) for a in e.args]
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return e.func(*args)
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
        return args[0] ** int(e.exp)
    if name in ("FloorDiv", "CleanDiv", "CeilDiv", "Mod", "PythonMod") and len(args) == 2:
        exact = _exact_quotient(*args)
        if exact is not None and name in ("Mod", "PythonMod"):
            if exact[1] == 1:
                return sympy.Integer(0)
        elif exact is not None:
            num, den = exact
            if name == "CeilDiv" and den != 1:
                num = num + den - 1
            if den == 1 or num.is_nonnegative:
                return FloorDiv(num, den)
    if name in ("FloorDiv", "CleanDiv", "CeilDiv", "Mod", "PythonMod", "ModularIndexing"):
        shift = _dividend_shift(e, args)
        if shift:  # a dividend that may be negative, made non-negative (C's / and % then agree with Python's)
            return _shifted_division(name, args, shift)
    if name in ("FloorDiv", "CleanDiv") and len(args) == 2:
        return FloorDiv(*args)
    if name == "CeilDiv" and len(args) == 2:
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if name in ("Mod", "PythonMod") and len(args) == 2:
        return ModIndex(*args)
    if name == "ModularIndexing":
        return ModIndex(FloorDiv(args[0], args[1]), args[2])
    if name == "PowByNatural" and isinstance(args[1], sympy.Integer):
        return args[0] ** int(args[1])
    if name in ("Max", "Min"):
        return (sympy.Max if name == "Max" else sympy.Min)(*args)
    raise DynamicShapeUnsupported(f"size expression {e} ({name}) is not modelled by kiln.inductor")


# torch's functions turning a float size expression into an int (``floor(1.5 * n)``, ``int(n * 0.5)``)
_FLOAT_TO_INT = frozenset({"FloorToInt", "CeilToInt", "TruncToInt"})


class DerivedSize(sympy.Symbol):
    """An integer size computed from a float expression of other sizes (an interpolation's output size
    ``floor(1.5 * s0)``): the wrapper computes it in Python (``source``) after the input sizes, and
    kernels take it as one more size argument. Index arithmetic has no float operations, so it sees
    the value only through this symbol; its name is a hash of the expression (the same expression is
    the same symbol in every graph and process)."""

    source: str  # a Python int expression over other size symbols
    depends: tuple[str, ...]  # the size symbols it reads

    def __new__(cls, name: str, source: str, depends: tuple[str, ...],  # type: ignore[misc]
                nonnegative: bool) -> DerivedSize:
        assumptions = {"integer": True, **({"nonnegative": True} if nonnegative else {})}
        obj = super().__new__(cls, name, **assumptions)
        obj.source, obj.depends = source, depends
        return obj

    def __getnewargs_ex__(self) -> tuple[tuple, dict]:  # type: ignore[override]
        return (self.name, self.source, self.depends, bool(self.is_nonnegative)), {}


def derived_size(e: sympy.Expr) -> DerivedSize:
    """``e`` (torch's ``FloorToInt(1.5*ToFloat(s0))``) as a DerivedSize."""
    for x in e.free_symbols:
        to_kiln(x)  # refuses unbacked symbols as every size does
    try:
        text = py_expr(e)
        source = text if text.startswith("int(") else f"int({text})"
    except SymbolicSizeError as err:
        raise DynamicShapeUnsupported(f"size expression {e} has no Python form: {err}") from err
    # non-negative only where that holds for every size (kiln's sizes may be 0) and every value of a
    # float argument (``int(s)`` of ``s = -1.5``): a division or remainder over it relies on that
    # (_check_nonnegative_division)
    low = bound_sympy(e, {x: _value_range(x) for x in e.free_symbols}).lower
    name = "s_" + hashlib.sha1(source.encode()).hexdigest()[:12]
    return DerivedSize(name, source, tuple(sorted(str(x) for x in e.free_symbols)), bool(low >= 0))


def _value_range(x: sympy.Symbol) -> ValueRanges:
    """What the compiled graph may see for ShapeEnv symbol ``x``: its range there, else [0, oo) for an
    integer (a size) and any real for a float argument's symbol."""
    env = _POSITIVE_SIZES.get()[1]
    known = getattr(env, "var_to_range", None) or {}
    if x in known:
        return known[x]
    return ValueRanges(0, sympy.oo) if x.is_integer else ValueRanges(-sympy.oo, sympy.oo)


def _without_max_one(e: sympy.Expr) -> sympy.Expr:
    if not e.has(sympy.Max):
        return e
    return e.replace(lambda a: isinstance(a, sympy.Max) and len(a.args) == 2 and sympy.Integer(1) in a.args,
                     lambda a: next(x for x in a.args if x != 1))
