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


def store_order(k: Kernel) -> list[int] | None:
    """The outer dims ordered by the stores' strides (largest first), when that is not the logical order
    and every store agrees: a kernel writing a transposed or channels-last buffer then walks memory
    contiguously instead of with a stride per lane (a padded, transposed weight copy took 0.78 ms on an
    H200 instead of ~0.04)."""
    xs = [index_var("x", i) for i in range(len(k.outer))]
    orders = set()
    for n in k.nodes:
        if not n.store or n.store_indirect:
            continue
        e = sympy.expand(sympy.sympify(n.store_index))
        coeffs = [e.coeff(v) for v in xs]
        if not all(c.is_number for c in coeffs) or any(v in c.free_symbols for c in coeffs for v in xs):
            return None
        live = [i for i in range(len(xs)) if k.outer[i] != 1]
        orders.add(tuple(sorted(live, key=lambda i: -int(coeffs[i]))))
    if len(orders) != 1:
        return None
    order = list(next(iter(orders)))
    if order == sorted(order):
        return None
    size1 = [i for i in range(len(xs)) if k.outer[i] == 1]
    return size1 + order


def _permute_outer(k: Kernel, order: list[int]) -> Kernel:
    tmp = {index_var("x", old): sympy.Symbol(f"_px{new}", integer=True, nonnegative=True)
           for new, old in enumerate(order)}
    final = {t: index_var("x", new) for new, t in enumerate(tmp.values())}
    mapping = {v: t.xreplace(final) for v, t in tmp.items()}
    nodes = tuple(dataclasses.replace(n, body=_rewrite_body(n.body, mapping),
                                      store_index=_rewrite(n.store_index, mapping),
                                      store_indirect=tuple(_rewrite_body(e, mapping) for e in n.store_indirect))
                  for n in k.nodes)
    return dataclasses.replace(k, outer=tuple(k.outer[i] for i in order), nodes=nodes)


def simplify_kernel(k: Kernel) -> Kernel:
    """The same kernel over a coalesced iteration space (outer and inner dims separately), the outer
    dims first put in the stores' memory order.

    The inner space's flat order is preserved, so argmax/argmin's flat r-index stays valid.
    """
    order = store_order(k) if not k.inner else None
    if order is not None:
        k = _permute_outer(k, order)
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
