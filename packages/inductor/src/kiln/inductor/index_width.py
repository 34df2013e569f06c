"""32-bit index arithmetic for Triton kernels over symbolic sizes, under one extent guard.

A kernel over symbolic sizes cannot bound its indices, so it computes them in 64 bits; on a GPU a
64-bit division by a run-time value (``x // s0 % 64``: a channel index of an NCHW tensor) is a
software routine of ~70 instructions, and a memory-bound kernel that divides per element runs 2-3x
slower than the same kernel over static sizes, whose divisions by constants are a multiply and a
shift. torch.compile meets this by guarding that each buffer's size fits 32 bits; kiln does the same
with one relation:

- every tensor of the graph (inputs with their strides, every intermediate) has an extent (1 + its
  largest offset, in elements), an expression over size symbols; extents that differ by a constant
  factor keep the largest (a dense ``[B, 768]`` and ``[B, 3072]``: ``3072*s0``);
- when every extent is at most the limit (``InductorOptions.index32_limit``, 2**30) at the example
  sizes, the compile asks the ShapeEnv for ``max(extents) <= limit``: a guard the capture checks before every call (a larger size
  recompiles, that size the new example) and the wrapper checks again. 2**30 leaves masked lanes past
  the end and one stride of slack below 2**31.

A graph whose largest tensor is already past half the limit at its example sizes keeps 64-bit indices
(no guard): its next larger call would fail the guard at once. So does one whose sizes have a declared
maximum (``mark_dynamic(..., max=)``, ``kiln.export``'s ``dynamic_shapes``) that the guard would cut
short: a range the caller asked for is served whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx

INDEX32_REASON = "32-bit indices in the kernels (kiln.inductor index_width.py)"


def index_guard(gm: fx.GraphModule, example_inputs: Sequence[Any], limit: int) -> str | None:
    """Guards (in the ShapeEnv) that every tensor of ``gm`` has at most ``limit`` elements of extent,
    and returns the relation's text; None, and no guard, when the graph is static, an extent is not
    an expression of sizes, or the example sizes leave less than a factor of 2 of room."""
    symbols = _symbol_values(example_inputs)
    if symbols is None:
        return None
    largest: dict[sympy.Expr, tuple[int, torch.Tensor]] = {}  # the extent without its factor -> (factor, tensor)
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if not isinstance(t, torch.Tensor):
                continue
            e = _extent(t, symbols)
            if e is None:
                return None
            if e.is_number:
                continue
            coeff, rest = e.as_coeff_Mul()
            if not isinstance(coeff, sympy.Integer):
                return None
            if rest not in largest or largest[rest][0] < int(coeff):
                largest[rest] = (int(coeff), t)
    if not largest:
        return None
    declared = _declared_maxima(example_inputs)
    reach = {**symbols, **declared}  # a size the caller declared a maximum for must keep its whole range
    for rest, (coeff, _) in largest.items():
        value, edge = _at(coeff * rest, symbols), _at(coeff * rest, reach)
        if value is None or edge is None or 2 * value > limit or (edge != value and edge > limit):
            return None
    bound: Any = None
    for _, t in largest.values():
        ext = _sym_extent(t, symbols)
        bound = ext if bound is None else torch.sym_max(bound, ext)
    if not bool(bound <= limit):  # records the guard in the ShapeEnv
        return None
    return f"max of {len(largest)} extent(s) <= {limit}"


def _declared_maxima(example_inputs: Sequence[Any]) -> dict[str, int]:
    """The finite upper ends of the size symbols' ranges in the ShapeEnv (declared by the caller)."""
    for x in example_inputs:
        vals = [x] if isinstance(x, torch.SymInt) else [*x.shape, *x.stride()] if isinstance(x, torch.Tensor) else []
        for v in vals:
            if isinstance(v, torch.SymInt):
                ranges = getattr(v.node.shape_env, "var_to_range", {})
                return {str(k): int(r.upper) for k, r in ranges.items() if getattr(r.upper, "is_Integer", False)}
    return {}


def _symbol_values(example_inputs: Sequence[Any]) -> dict[str, int] | None:
    """Every size symbol's example value, from the ShapeEnv of the inputs; None when static."""
    for x in example_inputs:
        vals = [x] if isinstance(x, torch.SymInt) else [*x.shape, *x.stride()] if isinstance(x, torch.Tensor) else []
        for v in vals:
            if isinstance(v, torch.SymInt):
                env = v.node.shape_env
                table = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", None) or {}
                return {str(k): int(x) for k, x in table.items() if isinstance(x, sympy.Integer)}
    return None


def _expr(v: object) -> sympy.Expr | None:
    if isinstance(v, torch.SymInt):
        return v.node.expr
    if isinstance(v, int):
        return sympy.Integer(v)
    return None


def _extent(t: torch.Tensor, symbols: dict[str, int]) -> sympy.Expr | None:
    """An upper bound of 1 + the largest offset of ``t`` (elements): its element count when it is dense
    in some order, else the sum of size * stride; None when a size or stride is not a sum or product
    of sizes (its value at the example sizes would not bound it)."""
    sizes: list[sympy.Expr] = []
    strides: list[sympy.Expr] = []
    for x, st in zip(t.shape, t.stride()):
        a, b = _expr(x), _expr(st)
        if a is None or b is None or not _increasing(a) or not _increasing(b):
            return None
        sizes.append(a)
        strides.append(b)
    if _dense(t, symbols):
        return sympy.Mul(*sizes)
    return sympy.Integer(1) + sympy.Add(*[a * b for a, b in zip(sizes, strides)])


def _sym_extent(t: torch.Tensor, symbols: dict[str, int]) -> Any:
    """``_extent`` as a SymInt (arithmetic only: no guard)."""
    if _dense(t, symbols):
        out: Any = 1
        for x in t.shape:
            out = out * x
        return out
    total: Any = 1
    for a, b in zip(t.shape, t.stride()):
        total = total + a * b
    return total


def _dense(t: torch.Tensor, symbols: dict[str, int]) -> bool:
    """Whether ``t``'s strides are a contiguous tensor's in some dim order (ordered by their example
    values, compared as expressions): its extent is then its element count."""
    keyed: list[tuple[int, sympy.Expr, sympy.Expr]] = []
    for x, stride in zip(t.shape, t.stride()):
        size, st = _expr(x), _expr(stride)
        if size == 1:
            continue
        value = _at(st, symbols) if size is not None and st is not None else None
        if value is None or size is None or st is None:
            return False
        keyed.append((value, size, st))
    expected: sympy.Expr = sympy.Integer(1)
    for _, size, st in sorted(keyed, key=lambda k: k[0]):
        if sympy.expand(st - expected) != 0:
            return False
        expected = expected * size
    return True


def _increasing(e: sympy.Expr) -> bool:
    """Whether ``e`` grows with every size symbol in it: sums, products with non-negative constants,
    positive integer powers, and floor/ceiling divisions by positive constants of such terms."""
    if isinstance(e, sympy.Integer):
        return True
    if isinstance(e, sympy.Symbol):
        return True
    if isinstance(e, sympy.Add):
        return all(_increasing(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        consts = [a for a in e.args if a.is_number]
        return all(c >= 0 for c in consts) and all(_increasing(a) for a in e.args if not a.is_number)
    if isinstance(e, sympy.Pow):
        return isinstance(e.exp, sympy.Integer) and int(e.exp) > 0 and _increasing(e.base)
    if type(e).__name__ in ("FloorDiv", "CeilDiv", "CleanDiv"):
        d = e.args[1]
        return isinstance(d, sympy.Integer) and int(d) > 0 and _increasing(e.args[0])
    if isinstance(e, (sympy.Max, sympy.Min)):
        return all(_increasing(a) for a in e.args)
    return False


def _at(e: sympy.Expr, values: dict[str, int]) -> int | None:
    v = e.xreplace({s: sympy.Integer(values[s.name]) for s in e.free_symbols if s.name in values})
    return int(v) if v.is_Integer else None
