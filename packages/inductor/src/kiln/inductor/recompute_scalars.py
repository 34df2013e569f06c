"""Scalar reductions recomputed by the reductions over the same range that read them (Triton backend).

Decode's RMSNorm before a one-row matmul (gemv_as_reduction.py): ``mean(x * x)`` over the model width is
a reduction to one value, and the matmul -- a reduction over the same width for each output column --
reads x scaled by it. Scheduled as written they are two kernels, a one-program kernel for the statistic
and the matmul's, and at bs=1 a kernel costs ~2 us of a ~40 us layer (two per layer: before q/k/v and
before the MLP). Every program of the matmul reads the whole of x anyway, so it computes the statistic
itself: the scalar reduction is copied into the consumer's output space (one value per output column,
the same for all), fusion puts the copy into the consumer's kernel, and its loads are the loads the
consumer makes.

Which reads: a reduction C over ``[O | K]`` (O more than one element) loading one element of a buffer R
that is a reduction to one element over the same reduced range K, up to size-1 dims (sum, max or min:
an RMSNorm's mean, ``x.abs().max()``); or loading a pointwise buffer B over K (up to size-1 dims,
contiguous) whose body reads such an R -- B was stored because several reductions read it (the MLP's
gate and up projections) -- whose body is then inlined into C first. K is one static range of at most
``MAX_REDUCED`` elements: every program of C computes the statistic again, so a long one would cost more than
the launch it saves. R and B themselves go
when nothing else reads them (dead code).
"""

from __future__ import annotations

import dataclasses

import sympy

from .ir import (
    ComputedBuffer,
    Layout,
    Load,
    LoopProgram,
    Pointwise,
    Reduction,
    index_vars,
    substitute_index,
)
from .ir.expr import Expr, cast, map_expr, reads
from .ir.index import product

MAX_REDUCED = 8192
_TYPES = ("sum", "max", "min")


def recompute_scalar_reductions(program: LoopProgram) -> tuple[LoopProgram, int]:
    """``program`` with such scalar reductions copied before each reduction that reads them; how many copies."""
    by_name = {n.name: n for n in program.nodes if isinstance(n, ComputedBuffer)}
    taken = set(by_name) | {b.name for b in program.inputs}
    copies: dict[tuple[str, tuple, tuple], ComputedBuffer] = {}  # (R, O, K) -> its copy
    nodes: list = []
    for n in program.nodes:
        if isinstance(n, ComputedBuffer) and isinstance(n.data, Reduction) and _reduced_range(n.data) is not None:
            made: list[ComputedBuffer] = []
            n = _rewrite(n, by_name, copies, taken, made)
            nodes.extend(made)
        nodes.append(n)
    if not copies:
        return program, 0
    return dataclasses.replace(program, nodes=tuple(nodes)), len(copies)


def _reduced_range(d: Reduction) -> int | None:
    """K's size when ``d`` qualifies as a consumer: one static reduced range, more than one output."""
    if len(d.reduction_ranges) != 1 or not isinstance(d.reduction_ranges[0], (int, sympy.Integer)):
        return None
    k = int(d.reduction_ranges[0])
    out = product(d.ranges)
    if k > MAX_REDUCED or k < 2 or (isinstance(out, (int, sympy.Integer)) and int(out) <= 1):
        return None
    return k


def _scalar_reduction(n: ComputedBuffer | None, k_ranges: tuple) -> bool:
    """Whether ``n`` is a reduction to one element over ``k_ranges``."""
    if n is None or not isinstance(n.data, Reduction):
        return False
    d = n.data
    return d.reduction_type in _TYPES and tuple(r for r in d.reduction_ranges if r != 1) == tuple(k_ranges) and \
        all(r == 1 for r in d.ranges) and all(s == 1 for s in n.layout.shape)


def _element(ld: Load) -> bool:
    """A load of one fixed element (no loop variable, no gather)."""
    return not ld.indirect and not any(str(s)[0] in "ir" for s in sympy.sympify(ld.index).free_symbols)


def _inlined(b: ComputedBuffer, ld: Load, k_ranges: tuple) -> Expr | None:
    """B's value at the element ``ld`` reads, as an expression over the consumer's variables; None when B
    is not a contiguous pointwise buffer over K (up to size-1 dims)."""
    if not isinstance(b.data, Pointwise) or ld.indirect or ld.dtype != b.layout.dtype:
        return None
    ranges = b.data.ranges
    wide = [j for j, r in enumerate(ranges) if r != 1]
    if len(wide) != 1 or ranges[wide[0]] != k_ranges[0] or tuple(b.layout.shape) != tuple(ranges) \
            or b.layout.offset != 0 or b.layout.stride[wide[0]] != 1:
        return None
    iv = index_vars("i", len(ranges))
    body = substitute_index(b.data.body, {v: (ld.index if j == wide[0] else sympy.Integer(0)) for j, v in enumerate(iv)})
    return body if body.dtype == b.layout.dtype else cast(body, b.layout.dtype)


def _rewrite(c: ComputedBuffer, by_name: dict[str, ComputedBuffer], copies: dict[tuple[str, tuple, tuple], ComputedBuffer],
             taken: set[str], made: list[ComputedBuffer]) -> ComputedBuffer:
    d = c.data
    assert isinstance(d, Reduction)
    k_ranges, out = tuple(d.reduction_ranges), tuple(d.ranges)

    def reads_scalar(e: Expr) -> bool:
        return any(_scalar_reduction(by_name.get(ld.buffer), k_ranges) and _element(ld) for ld in reads(e))

    def inline(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.buffer in by_name:
            value = _inlined(by_name[e.buffer], e, k_ranges)
            if value is not None and reads_scalar(value):
                return value
        return None

    def recompute(e: Expr) -> Expr | None:
        if not (isinstance(e, Load) and _element(e) and _scalar_reduction(by_name.get(e.buffer), k_ranges)):
            return None
        key = (e.buffer, out, k_ranges)
        if key not in copies:
            r = by_name[e.buffer]
            rd = r.data
            assert isinstance(rd, Reduction)
            name = _fresh(f"{r.name}_{c.name}", taken)
            # R's own loop variables in the consumer's: its outputs (all size 1) at 0, its reduced dims of size 1 at 0
            # (``x.abs().max()`` over a [1, K] vector reduces [1, K]), the one of size K as r0
            to = {v: sympy.Integer(0) for v in index_vars("i", len(rd.ranges))}
            for v, size in zip(index_vars("r", len(rd.reduction_ranges)), rd.reduction_ranges):
                to[v] = sympy.Integer(0) if size == 1 else index_vars("r", 1)[0]
            copies[key] = ComputedBuffer(name, Layout.contiguous(out, r.layout.dtype, r.layout.device),
                                         Reduction(out, k_ranges, rd.reduction_type, substitute_index(rd.body, to)),
                                         r.origins)
            made.append(copies[key])
        copy = copies[key]
        return Load(copy.name, copy.layout.store_index(), e.dtype)

    body = map_expr(d.body, inline)
    body = map_expr(body, recompute)
    return c if body is d.body else dataclasses.replace(c, data=dataclasses.replace(d, body=body))


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name
