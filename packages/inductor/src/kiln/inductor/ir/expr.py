"""Loop bodies as data: expression trees over loads, constants, index values and named ops.

A body is a tree of ``Expr`` nodes evaluated at one point of its iteration space; index expressions
(sympy) refer to that space's loop variables. Every node carries its result dtype. Bodies are frozen,
hashable and printable, so codegen, dependency analysis and the verifier are all visitors over them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import sympy
import torch

from .index import IndexExpr, fold_divmod, index_str


@dataclass(frozen=True, slots=True)
class OpInfo:
    arity: int
    kind: str  # "math" (float), "arith", "compare" (-> bool), "logical" (bool), "bitwise", "select", "random"
    doc: str = ""


def _ops(kind: str, arity: int, names: str) -> dict[str, OpInfo]:
    return {n: OpInfo(arity, kind) for n in names.split()}


# The op vocabulary of loop bodies. Backends must implement every entry (codegen tests check this).
OPS: dict[str, OpInfo] = {
    **_ops("math", 1, "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan "
                      "sinh cosh tanh asinh acosh atanh erf erfc sigmoid reciprocal floor ceil "
                      "trunc round frac lgamma"),
    **_ops("arith", 1, "neg abs sign square relu"),
    **_ops("arith", 2, "add sub mul truediv floordiv truncdiv mod fmod maximum minimum"),
    **_ops("math", 2, "pow atan2 copysign hypot"),
    **_ops("compare", 2, "eq ne lt le gt ge"),
    **_ops("compare", 1, "isnan isinf isfinite"),
    **_ops("logical", 2, "logical_and logical_or logical_xor"),
    **_ops("logical", 1, "logical_not"),
    **_ops("bitwise", 2, "bitwise_and bitwise_or bitwise_xor lshift rshift"),
    **_ops("bitwise", 1, "bitwise_not"),
    **_ops("select", 3, "where"),
    # counter-based random numbers: args are (seed, offset); offset is an int64 IndexValue
    **_ops("random", 2, "rand randn"),
    # check_index(i, n): a loaded index into a dim of size n, negative ones counted from the end; out of
    # range (eager's IndexError) is reported and the access made at 0, never outside the tensor
    "check_index": OpInfo(2, "arith", "an index value checked against its dim's size"),
    # check_index_nonneg(i, n): the same for ops whose eager form rejects negative indices (embedding,
    # gather, scatter, index_select)
    "check_index_nonneg": OpInfo(2, "arith", "a non-negative index value checked against its dim's size"),
}


@dataclass(frozen=True, slots=True)
class Load:
    """Read ``buffer`` at flat element offset ``index``.

    Indirect (gather) loads: ``index`` may use symbols ``d0, d1, ...`` bound to the int64 values of
    the expressions in ``indirect`` (evaluated at the same point), e.g. embedding rows.
    """

    buffer: str
    index: IndexExpr
    dtype: torch.dtype
    indirect: tuple[Expr, ...] = ()


@dataclass(frozen=True, slots=True)
class Constant:
    value: bool | int | float
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class IndexValue:
    """An index expression used as a value (iota, masks of cat/pad, random offsets)."""

    index: IndexExpr
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class Op:
    """A named op from ``OPS`` applied to operands; ``dtype`` is the result type."""

    name: str
    args: tuple[Expr, ...]
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class Cast:
    x: Expr
    dtype: torch.dtype


Expr = Load | Constant | IndexValue | Op | Cast


def op(name: str, *args: Expr, dtype: torch.dtype) -> Op:
    return Op(name, tuple(args), dtype)


def cast(x: Expr, dtype: torch.dtype) -> Expr:
    if x.dtype == dtype:
        return x
    if isinstance(x, Constant):
        return Constant(_convert(x.value, dtype), dtype)
    return Cast(x, dtype)


def _convert(v: bool | int | float, dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return float(v)
    return int(v)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Load):
        return e.indirect
    if isinstance(e, Cast):
        return (e.x,)
    return ()


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order traversal (shared subtrees are visited once per occurrence)."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` may return a replacement for a leaf or rebuilt node."""
    cache: dict[int, Expr] = {}

    def go(n: Expr) -> Expr:
        key = id(n)
        hit = cache.get(key)
        if hit is not None:
            return hit
        # children compared by identity: ``==`` on rebuilt subtrees would compare them field by field
        cls = type(n)
        if cls is Op:
            args = n.args  # type: ignore[union-attr]
            new_args = tuple([go(a) for a in args])
            same = all(a is b for a, b in zip(new_args, args))
            n2: Expr = n if same else Op(n.name, new_args, n.dtype)  # type: ignore[union-attr]
        elif cls is Cast:
            x = go(n.x)  # type: ignore[union-attr]
            n2 = n if x is n.x else Cast(x, n.dtype)  # type: ignore[union-attr]
        elif cls is Load and n.indirect:  # type: ignore[union-attr]
            ind = tuple([go(a) for a in n.indirect])  # type: ignore[union-attr]
            same = all(a is b for a, b in zip(ind, n.indirect))  # type: ignore[union-attr]
            n2 = n if same else Load(n.buffer, n.index, n.dtype, ind)  # type: ignore[union-attr]
        else:
            n2 = n
        r = fn(n2)
        out = n2 if r is None else r
        cache[key] = out
        return out

    return go(e)


def substitute_index(e: Expr, mapping: Mapping[sympy.Symbol, IndexExpr]) -> Expr:
    """Replace loop variables inside every index expression of ``e`` (how views fold into loads).
    The replacement is simultaneous (``i0 -> i1, i1 -> i0`` swaps them)."""
    if not mapping:
        return e
    items = tuple(mapping.items())

    def fn(n: Expr) -> Expr | None:
        # an index the mapping leaves as it was keeps its node: unchanged subtrees stay the same objects
        if isinstance(n, Load):
            index = substituted(n.index, items)
            return None if index == n.index else Load(n.buffer, index, n.dtype, n.indirect)
        if isinstance(n, IndexValue):
            index = substituted(n.index, items)
            return None if index == n.index else IndexValue(index, n.dtype)
        return None

    return map_expr(e, fn)


@functools.lru_cache(maxsize=1 << 16)
def substituted(index: IndexExpr, items: tuple[tuple[sympy.Symbol, IndexExpr], ...]) -> IndexExpr:
    """``expand(index.xreplace(dict(items)))``, cached: a model's repeated layers fold the same views
    into the same indices, and sympy's expand is the cost (the key is the whole input, so a changed
    index or mapping is a new entry)."""
    return fold_divmod(sympy.expand(index.xreplace(dict(items))))


def reads(e: Expr) -> list[Load]:
    """The loads of ``e`` in pre-order of first occurrence. A subtree object met again (an inlined
    value used twice) is not walked again: its loads were all seen the first time."""
    seen: dict[Load, None] = {}
    visited: set[int] = set()
    stack: list[Expr] = [e]
    while stack:
        n = stack.pop()
        if id(n) in visited:
            continue
        visited.add(id(n))
        cls = type(n)
        if cls is Load:
            seen[n] = None  # type: ignore[index]
            if n.indirect:  # type: ignore[union-attr]
                stack.extend(reversed(n.indirect))  # type: ignore[union-attr]
        elif cls is Op:
            stack.extend(reversed(n.args))  # type: ignore[union-attr]
        elif cls is Cast:
            stack.append(n.x)  # type: ignore[union-attr]
    return list(seen)


def size(e: Expr, limit: int | None = None) -> int:
    """Nodes in ``e`` counted per occurrence; with ``limit``, counting stops past it (the answer is
    then some number > limit): callers comparing against a bound need not walk a huge body."""
    count = 0
    stack = [e]
    while stack:
        n = stack.pop()
        count += 1
        if limit is not None and count > limit:
            return count
        cls = type(n)
        if cls is Op:
            stack.extend(n.args)  # type: ignore[union-attr]
        elif cls is Cast:
            stack.append(n.x)  # type: ignore[union-attr]
        elif cls is Load and n.indirect:  # type: ignore[union-attr]
            stack.extend(n.indirect)  # type: ignore[union-attr]
    return count


def format_dtype(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def format_expr(e: Expr) -> str:
    if isinstance(e, Load):
        if e.indirect:
            binds = ", ".join(f"d{k}={format_expr(a)}" for k, a in enumerate(e.indirect))
            return f"{e.buffer}[{index_str(e.index)} | {binds}]"
        return f"{e.buffer}[{index_str(e.index)}]"
    if isinstance(e, Constant):
        return repr(e.value)
    if isinstance(e, IndexValue):
        return f"index({index_str(e.index)})"
    if isinstance(e, Cast):
        return f"to_{format_dtype(e.dtype)}({format_expr(e.x)})"
    return f"{e.name}({', '.join(format_expr(a) for a in e.args)})"
