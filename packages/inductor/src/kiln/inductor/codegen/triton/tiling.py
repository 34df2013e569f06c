"""Iteration-space simplification before Triton codegen: drop size-1 dims, merge dims that every index
expression walks contiguously, so a contiguous (N, C, H, W) kernel indexes with one ``xindex`` and
no division at all.

Dims ``k`` and ``k+1`` merge when every index expression of the kernel is linear in both and
``coeff(v_k) == coeff(v_{k+1}) * size_{k+1}``; then ``v_k -> 0, v_{k+1} -> merged`` rewrites every
expression exactly (it is a plain symbol substitution).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from ...ir import Expr, IndexExpr, IndexValue, Kernel, Load, index_var, map_expr, walk


def kernel_indices(k: Kernel) -> list[IndexExpr]:
    out: list[IndexExpr] = []
    for n in k.nodes:
        out.append(sympy.sympify(n.store_index))
        for root in (n.body, *n.store_indirect):
            for e in walk(root):
                if isinstance(e, (Load, IndexValue)):
                    out.append(e.index)
    return out


def _linear_coeffs(e: IndexExpr, a: sympy.Symbol, b: sympy.Symbol) -> tuple[IndexExpr, IndexExpr] | None:
    e = sympy.expand(e)
    ca, cb = e.coeff(a), e.coeff(b)
    rest = sympy.expand(e - ca * a - cb * b)
    if a in rest.free_symbols or b in rest.free_symbols:
        return None
    if (ca.free_symbols | cb.free_symbols) & {a, b}:
        return None
    if any(s.name[0] in "xr" and s.name[1:].isdigit() for s in (ca.free_symbols | cb.free_symbols)):
        return None
    return ca, cb


def _can_merge(indices: Sequence[IndexExpr], a: sympy.Symbol, b: sympy.Symbol, size_b: IndexExpr) -> bool:
    for e in indices:
        if a not in e.free_symbols and b not in e.free_symbols:
            continue
        cs = _linear_coeffs(e, a, b)
        if cs is None or sympy.expand(cs[0] - cs[1] * size_b) != 0:
            return False
    return True


def coalesce(sizes: Sequence[IndexExpr], prefix: str, indices: Sequence[IndexExpr]
             ) -> tuple[list[IndexExpr], dict[sympy.Symbol, IndexExpr]]:
    """New sizes and a substitution from the old ``prefix`` vars to the new ones (renumbered from 0)."""
    vars_ = [index_var(prefix, i) for i in range(len(sizes))]
    dims: list[tuple[sympy.Symbol, IndexExpr]] = []
    subst: dict[sympy.Symbol, IndexExpr] = {}
    for v, s in zip(vars_, sizes):
        if s == 1:
            subst[v] = sympy.Integer(0)
        else:
            dims.append((v, s))
    cur = [sympy.expand(e.xreplace(subst)) for e in indices]
    j = len(dims) - 1
    while j > 0:
        (a, sa), (b, sb) = dims[j - 1], dims[j]
        if _can_merge(cur, a, b, sb):
            # a -> 0, b stands for the merged dim
            subst = {k: sympy.expand(v.xreplace({a: 0})) for k, v in subst.items()}
            subst[a] = sympy.Integer(0)
            cur = [sympy.expand(e.xreplace({a: 0})) for e in cur]
            dims[j - 1:j + 1] = [(b, sa * sb)]
        j -= 1
    # renumber the surviving vars 0..m-1, through temporaries so names never collide
    tmp = {v: sympy.Symbol(f"_t{prefix}{i}", integer=True, nonnegative=True) for i, (v, _) in enumerate(dims)}
    final = {t: index_var(prefix, i) for i, t in enumerate(tmp.values())}
    full: dict[sympy.Symbol, IndexExpr] = {}
    for v in vars_:
        e = subst.get(v, v)
        full[v] = e.xreplace(tmp).xreplace(final) if isinstance(e, sympy.Expr) else e
    return [s for _, s in dims], full


def _rewrite(e: IndexExpr, mapping: dict[sympy.Symbol, IndexExpr]) -> IndexExpr:
    return sympy.expand(sympy.sympify(e).xreplace(mapping))


def _rewrite_body(body: Expr, mapping: dict[sympy.Symbol, IndexExpr]) -> Expr:
    def fn(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            return Load(n.buffer, _rewrite(n.index, mapping), n.dtype, n.indirect)
        if isinstance(n, IndexValue):
            return IndexValue(_rewrite(n.index, mapping), n.dtype)
        return None
    return map_expr(body, fn)


def simplify_kernel(k: Kernel) -> Kernel:
    """The same kernel over a coalesced iteration space (outer and inner dims separately); the
    scheduler already put the outer dims in the stores' memory order (scheduler/loop_order.py).

    The inner space's flat order is preserved, so argmax/argmin's flat r-index stays valid.
    """
    indices = kernel_indices(k)
    outer, xmap = coalesce(k.outer, "x", indices)
    inner, rmap = coalesce(k.inner, "r", indices) if k.inner else ([], {})
    if k.inner and not inner:
        inner = [sympy.Integer(1)]  # still a row kernel (reduction over a size-1 space)
    mapping = {**xmap, **rmap}
    nodes = tuple(dataclasses.replace(n, body=_rewrite_body(n.body, mapping),
                                      store_index=_rewrite(n.store_index, mapping),
                                      store_indirect=tuple(_rewrite_body(e, mapping) for e in n.store_indirect))
                  for n in k.nodes)
    return dataclasses.replace(k, outer=tuple(outer), inner=tuple(inner), nodes=nodes)
