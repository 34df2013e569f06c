"""Loop order: a kernel's outer (parallel) loops follow the memory order of what it stores.

Loop nodes iterate in logical dim order (N, C, H, W). A kernel storing a channels-last buffer in that
order writes with stride C in the innermost loop (no vectorization in C++, uncoalesced in Triton).
Outer points are independent, so permuting the outer loops is a renaming: order them by the stride
of the first stored index, outermost = largest, so the store (and reads in the same layout) walk
memory contiguously, and ``merge_loops`` then collapses the whole NHWC space into one loop. With
symbolic sizes a stride is an expression (``C``, ``W*C``): it is ranked by its value at the example
sizes (``hints``): any order is correct, the example's is the one made fast. A dynamic ResNet-50
otherwise walked its NHWC activations in NCHW order, 3x slower than the static graph on an H200.
"""

from __future__ import annotations

import dataclasses
import functools

import sympy

from ..ir import (
    IndexExpr,
    KernelNode,
    index_vars,
    is_size_symbol,
    substitute_hints,
    substitute_index,
)


@functools.lru_cache(maxsize=1 << 14)
def _coefficient(e: IndexExpr, v: sympy.Symbol) -> IndexExpr | None:
    """The stride of ``v`` in ``e`` when ``e`` is linear in ``v`` with a coefficient free of loop
    variables: a number or an expression of sizes (cached: a model's repeated layers ask about the
    same indices)."""
    c = sympy.expand(e).coeff(v)
    return c if c.is_number or all(is_size_symbol(s) for s in c.free_symbols) else None


def order_outer_loops(outer: tuple, nodes: list[KernelNode],
                      hints: dict[str, int] | None = None) -> tuple[tuple, list[KernelNode]]:
    """``outer`` and ``nodes`` with the outer loops permuted into the first store's stride order;
    symbolic strides ranked at ``hints`` (the example sizes)."""
    xs = index_vars("x", len(outer))
    ref = next((kn.store_index for kn in nodes if kn.store and kn.role == "outer" and not kn.store_indirect),
               None)
    if ref is None or len(outer) < 2:
        return outer, nodes
    found = [_coefficient(ref, x) for x in xs]
    coeffs = [c for c in found if c is not None]
    if len(coeffs) != len(found):
        return outer, nodes
    if not all(c.is_number for c in coeffs):
        coeffs = [sympy.sympify(substitute_hints(c, hints or {})) for c in coeffs]
        if not all(c.is_number for c in coeffs):
            return outer, nodes
    # dims the store does not walk (size 1) keep their place among the outermost
    order = sorted(range(len(outer)), key=lambda k: (-int(coeffs[k]) if outer[k] != 1 else -(2**62), k))
    if order == list(range(len(outer))):
        return outer, nodes
    tmp = {xs[k]: sympy.Symbol(f"_o{k}", integer=True) for k in range(len(outer))}
    final = {tmp[xs[k]]: xs[j] for j, k in enumerate(order)}
    out = []
    for kn in nodes:
        body = substitute_index(substitute_index(kn.body, tmp), final)
        store = sympy.expand(kn.store_index.xreplace(tmp).xreplace(final))
        indirect = tuple(substitute_index(substitute_index(e, tmp), final) for e in kn.store_indirect)
        out.append(dataclasses.replace(kn, body=body, store_index=store, store_indirect=indirect))
    return tuple(outer[k] for k in order), out
