"""Turn fused groups into Kernel descriptions: rename to kernel variables, assign stages, decide stores,
merge loop dimensions that index memory contiguously, and name kernels after the ops they fuse."""

from __future__ import annotations

import functools

import sympy

from ..ir import (
    ComputedBuffer,
    IndexExpr,
    IndexValue,
    Kernel,
    KernelNode,
    Load,
    LoopProgram,
    Pointwise,
    Reduction,
    Scan,
    Scatter,
    index_vars,
    map_expr,
    reads,
    substitute_index,
    walk,
)
from .dependencies import Dependencies
from .fusion import Group, var_renaming
from .loop_order import order_outer_loops


def _scan_kernel(n: ComputedBuffer, number: int) -> Kernel:
    """A scan runs sequentially along its axis (inner loop) for every other index (parallel outer)."""
    d = n.data
    assert isinstance(d, Scan)
    iv = index_vars("i", len(d.ranges))
    others = [k for k in range(len(d.ranges)) if k != d.axis]
    ren = {iv[k]: index_vars("x", len(others))[j] for j, k in enumerate(others)}
    ren[iv[d.axis]] = index_vars("r", 1)[0]
    kn = KernelNode(n.name, "full", "scan", substitute_index(d.body, ren),
                    sympy.expand(n.layout.store_index().xreplace(ren)), n.layout.dtype, 0, True, d.scan_type)
    outer = tuple(d.ranges[k] for k in others)
    inputs = tuple(dict.fromkeys(ld.buffer for ld in reads(kn.body)))
    name = f"k{number}_" + "_".join(n.origins) if n.origins else f"k{number}_scan"
    return Kernel(name, outer, (d.ranges[d.axis],), (kn,), inputs, (n.name,))


def _scatter_kernel(n: ComputedBuffer, number: int) -> Kernel:
    """Initial copy over the output (parallel), then the scatter over the source space (sequential)."""
    d = n.data
    assert isinstance(d, Scatter)
    iv = index_vars("i", len(d.ranges))
    xv = index_vars("x", len(d.ranges))
    ren = dict(zip(iv, xv))
    init = KernelNode(n.name, "outer", "pointwise", substitute_index(d.base, ren),
                      sympy.expand(n.layout.store_index().xreplace(ren)), n.layout.dtype, 0, True)
    sc = KernelNode(n.name, "full", "scatter", d.value, d.index, n.layout.dtype, 1, True, d.mode, d.indirect)
    inputs = tuple(dict.fromkeys(ld.buffer for e in (d.base, d.value, *d.indirect) for ld in reads(e)))
    name = f"k{number}_" + "_".join(n.origins) if n.origins else f"k{number}_scatter"
    return Kernel(name, tuple(d.ranges), tuple(d.src_ranges), (init, sc), inputs, (n.name,))


def build_kernel(g: Group, p: LoopProgram, deps: Dependencies, number: int) -> Kernel:
    nodes = [p.nodes[k] for k in g.members]
    if len(nodes) == 1 and isinstance(nodes[0], ComputedBuffer) and isinstance(nodes[0].data, Scatter):
        return _scatter_kernel(nodes[0], number)
    if len(nodes) == 1 and isinstance(nodes[0], ComputedBuffer) and isinstance(nodes[0].data, Scan):
        return _scan_kernel(nodes[0], number)
    names = {n.name for n in nodes}  # type: ignore[union-attr]
    stage: dict[str, int] = {}
    avail: dict[str, int] = {}  # outer values: after which loop they are ready (-1: before the first)
    built: list[KernelNode] = []
    for n in nodes:
        assert isinstance(n, ComputedBuffer)
        role = g.roles[n.name]
        d = n.data
        assert not isinstance(d, Scatter)  # (a scatter is a kernel of its own: _scatter_kernel)
        ren = var_renaming(n, role, tuple(g.outer))
        body = substitute_index(d.body, ren)
        store_index = sympy.expand(n.layout.store_index().xreplace(ren))
        in_group = [ld.buffer for ld in reads(d.body) if ld.buffer in names]
        if role == "full" or isinstance(d, Reduction):
            s = 0
            for b in in_group:
                s = max(s, stage[b] if g.roles[b] == "full" else avail[b] + 1)
            stage[n.name] = s
            if isinstance(d, Reduction):
                avail[n.name] = s
        else:
            avail[n.name] = max((avail.get(b, -1) for b in in_group), default=-1)
            stage[n.name] = avail[n.name] + 1
        kind = "reduction" if isinstance(d, Reduction) else "scan" if isinstance(d, Scan) else "pointwise"
        rtype = d.reduction_type if isinstance(d, Reduction) else d.scan_type if isinstance(d, Scan) else ""
        built.append(KernelNode(n.name, role, kind, body, store_index, n.layout.dtype, stage[n.name], False, rtype))
    # stores: read outside the kernel, returned, or read from memory by a later stage
    later_reads: set[str] = set()
    for kn in built:
        for ld in reads(kn.body):
            if ld.buffer in names and g.roles[ld.buffer] == "full" and stage[ld.buffer] != kn.stage:
                later_reads.add(ld.buffer)
    final = []
    for kn in built:
        outside = any(p.nodes[k] not in nodes for k in deps.readers.get(kn.buffer, []))
        store = outside or kn.buffer in deps.outputs or kn.buffer in later_reads or not g.inner and False
        final.append(_replace_store(kn, store))
    outer, final = order_outer_loops(tuple(g.outer), final, p.hints)  # channels-last stores walk memory in order
    outer, inner, final = merge_loops(outer, tuple(g.inner or ()), final)
    ext_inputs = list(dict.fromkeys(ld.buffer for kn in final for ld in reads(kn.body) if ld.buffer not in names))
    outputs = tuple(kn.buffer for kn in final if kn.store)
    origins = list(dict.fromkeys(o for n in nodes for o in n.origins))  # type: ignore[union-attr]
    name = f"k{number}_" + "_".join(origins)[:48].rstrip("_") if origins else f"k{number}"
    return Kernel(name, outer, inner, tuple(final), tuple(ext_inputs), outputs)


def _replace_store(kn: KernelNode, store: bool) -> KernelNode:
    return KernelNode(kn.buffer, kn.role, kn.kind, kn.body, kn.store_index, kn.dtype, kn.stage, store,
                      kn.reduction_type)


def _indices(nodes: list[KernelNode]) -> list[IndexExpr]:
    out: list[IndexExpr] = []
    for kn in nodes:
        out.append(kn.store_index)
        for e in walk(kn.body):
            if isinstance(e, (Load, IndexValue)):
                out.append(e.index)
    return out


@functools.lru_cache(maxsize=1 << 14)
def _linear_coeffs(e: IndexExpr, a: sympy.Symbol, b: sympy.Symbol) -> tuple[IndexExpr, IndexExpr] | None:
    """Coefficients of ``a`` and ``b`` when ``e`` is linear in them (outside any function), else None.
    Cached: a model's repeated layers merge the same loops over the same indices."""
    ca, cb = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(e):
        syms = term.free_symbols
        if a not in syms and b not in syms:
            continue
        coef, dep = term.as_independent(a, b, as_Add=False)
        if dep == a:
            ca += coef
        elif dep == b:
            cb += coef
        else:
            return None
    return ca, cb


def _mergeable(exprs: list[IndexExpr], a: sympy.Symbol, b: sympy.Symbol, size_b: IndexExpr) -> bool:
    for e in exprs:
        syms = e.free_symbols
        if a not in syms and b not in syms:
            continue
        c = _linear_coeffs(e, a, b)
        if c is None or sympy.expand(c[0] - c[1] * size_b) != 0:
            return False
    return True


def _apply(nodes: list[KernelNode], mapping: dict) -> list[KernelNode]:
    out = []
    for kn in nodes:
        body = substitute_index(kn.body, mapping)
        out.append(KernelNode(kn.buffer, kn.role, kn.kind, body, sympy.expand(kn.store_index.xreplace(mapping)),
                              kn.dtype, kn.stage, kn.store, kn.reduction_type))
    return out


def _merge_dims(prefix: str, loop_ranges: tuple, nodes: list[KernelNode]) -> tuple[tuple, list[KernelNode]]:
    """Collapse adjacent loop dims (and drop size-1 dims) where every index is linear across them."""
    ranges = list(loop_ranges)
    vs = list(index_vars(prefix, len(ranges)))
    # drop size-1 dims
    keep = [k for k, s in enumerate(ranges) if s != 1]
    mapping = {vs[k]: sympy.Integer(0) for k in range(len(ranges)) if ranges[k] == 1}
    ranges = [ranges[k] for k in keep]
    cur = [vs[k] for k in keep]
    k = len(ranges) - 2
    exprs = _indices(_apply(nodes, mapping)) if mapping else _indices(nodes)
    while k >= 0:
        a, b = cur[k], cur[k + 1]
        if _mergeable(exprs, a, b, ranges[k + 1]):
            # a*c*size_b + b*c -> b*c with b ranging over size_a*size_b
            sub = {a: sympy.Integer(0)}
            exprs = [sympy.expand(e.xreplace(sub)) for e in exprs]
            mapping = {s: sympy.expand(v.xreplace(sub)) for s, v in mapping.items()}
            mapping[a] = sympy.Integer(0)
            ranges[k + 1] = ranges[k] * ranges[k + 1]
            del ranges[k], cur[k]
        k -= 1
    # rename surviving vars to prefix0..n: one simultaneous substitution (x1 -> x0, x0 -> 0 cannot
    # collide), composed with the merges and size-1 drops
    final = {v: index_vars(prefix, len(cur))[j] for j, v in enumerate(cur)}
    composed = {s: v.xreplace(final) for s, v in mapping.items()}
    for v in cur:
        composed.setdefault(v, final[v])
    composed = {s: v for s, v in composed.items() if s != v}
    return tuple(ranges), _apply(nodes, composed)


def merge_loops(outer: tuple, inner: tuple, nodes: list[KernelNode]) -> tuple[tuple, tuple, list[KernelNode]]:
    outer2, nodes = _merge_dims("x", outer, nodes)
    inner2: tuple = ()
    if inner:
        inner2, nodes = _merge_dims("r", inner, nodes)
    return outer2, inner2, nodes


__all__ = ["build_kernel", "merge_loops", "map_expr", "Pointwise"]
