"""Fusion: group loop nodes into kernels.

Vertical fusion (a consumer joins its producer's kernel) and horizontal fusion (independent work over
the same iteration space) both go through one test, ``fits``: a node joins a group when its iteration
space is the group's outer space, or outer+inner space of a row kernel, and every value it reads from
the group is the element (or row) the group computes at the same point. Nodes are visited in program
order and only join a group created after all of their other producers, so the order stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ..ir import (
    WAIT_TENSOR,
    ComputedBuffer,
    ExternKernel,
    IndexExpr,
    LoopProgram,
    Node,
    Pointwise,
    Reduction,
    Scatter,
    args_buffers,
    index_vars,
    node_reads,
    product,
    reads,
)
from ..options import InductorOptions
from .dependencies import Dependencies

LOOKBACK = 8  # how many recent groups a node may join (bounds compile time)


@dataclass
class Group:
    outer: tuple[IndexExpr, ...]
    inner: tuple[IndexExpr, ...] | None  # None: a pointwise group (may still become a row kernel)
    members: list[int] = field(default_factory=list)  # node indices, in order
    roles: dict[str, str] = field(default_factory=dict)  # buffer -> "full" | "outer"
    extern: bool = False  # a group of one node nothing fuses with (extern call, scan)

    def renaming(self, node: ComputedBuffer, role: str) -> dict[sympy.Symbol, IndexExpr]:
        return var_renaming(node, role, tuple(self.outer))


def var_renaming(node: ComputedBuffer, role: str, outer: tuple[IndexExpr, ...]) -> dict[sympy.Symbol, IndexExpr]:
    """Node loop variables (i*, r*) -> kernel variables (x*, r*) for a node playing ``role`` in a kernel
    whose outer loops are ``outer``."""
    d = node.data
    n_outer = len(outer)
    iv = index_vars("i", len(d.ranges))
    xv, rv = index_vars("x", n_outer), index_vars("r", len(d.ranges))
    if role == "outer" and not isinstance(d, Reduction) and tuple(d.ranges) != tuple(outer):
        # the same space up to size-1 dims (_role: an epilogue over [1, 1, N] of a reduction over [1, N])
        ren: dict[sympy.Symbol, IndexExpr] = {v: sympy.Integer(0) for v, n in zip(iv, d.ranges) if n == 1}
        ren.update(zip((v for v, n in zip(iv, d.ranges) if n != 1), (x for x, n in zip(xv, outer) if n != 1)))
        return ren
    if isinstance(d, Reduction) or role == "outer":
        return dict(zip(iv, xv))
    return {**dict(zip(iv[:n_outer], xv)), **dict(zip(iv[n_outer:], rv))}


def _without_ones(ranges: tuple) -> tuple:
    return tuple(n for n in ranges if n != 1)


def _role(g: Group, node: ComputedBuffer) -> tuple[str, tuple, tuple | None] | None:
    """The node's role in ``g`` and the group's (outer, inner) after it joins, or None."""
    d = node.data
    if isinstance(d, Reduction):
        o, r = tuple(d.ranges), tuple(d.reduction_ranges)
        if g.inner is None:
            if tuple(g.outer) == o + r:
                return "outer", o, r
            if tuple(g.outer) == o:
                return "outer", o, r
            return None
        return ("outer", o, r) if (o == tuple(g.outer) and r == tuple(g.inner)) else None
    if not isinstance(d, Pointwise):
        return None
    p = tuple(d.ranges)
    if g.inner is None:
        return ("outer", p, None) if p == tuple(g.outer) else None
    if p == tuple(g.outer) + tuple(g.inner):
        if not g.outer:  # an epilogue over a whole-tensor reduction: its own parallel kernel is faster
            return None
        return "full", tuple(g.outer), tuple(g.inner)
    if p == tuple(g.outer) or _without_ones(p) == _without_ones(tuple(g.outer)):
        return "outer", tuple(g.outer), tuple(g.inner)  # a row kernel's outer loops stay as they are
    return None


def _reads_ok(g: Group, node: ComputedBuffer, role: str, outer: tuple, inner: tuple | None,
              program: LoopProgram) -> bool:
    """Every load of a group buffer must read exactly what the group computes at this point."""
    n_outer = len(outer)
    ren = var_renaming(node, role, outer)
    nodes = program.nodes
    # a size-1 dim's variable is 0: a store over [B, 1, L, S] and a load that skips that dim (the
    # attention mask converted for the extern) read the same element
    unit = {v: sympy.Integer(0) for v, n in zip((*index_vars("x", n_outer), *index_vars("r", len(inner or ()))),
                                                (*outer, *(inner or ()))) if n == 1}
    data = node.data
    assert not isinstance(data, Scatter)  # (fits() takes pointwise and reduction nodes only)
    for ld in reads(data.body):
        prod_role = g.roles.get(ld.buffer)
        if prod_role is None:
            continue
        prod = next(nodes[k] for k in g.members if nodes[k].name == ld.buffer)  # type: ignore[union-attr]
        assert isinstance(prod, ComputedBuffer)
        # a pointwise group turning into a row kernel: its members become full-role
        if g.inner is None and inner is not None and len(prod.data.ranges) == n_outer + len(inner):
            prod_role = "full"
        if prod_role == "full" and role == "outer" and not isinstance(node.data, Reduction):
            return False
        want = prod.layout.store_index().xreplace(var_renaming(prod, prod_role, outer))
        got = ld.index.xreplace(ren)
        if unit:
            want, got = want.xreplace(unit), got.xreplace(unit)
        if sympy.expand(want - got) != 0:
            return False
    return True


def fits(g: Group, node: Node, program: LoopProgram) -> tuple[str, tuple, tuple | None] | None:
    if g.extern or not isinstance(node, ComputedBuffer) or not isinstance(node.data, (Pointwise, Reduction)):
        return None
    r = _role(g, node)
    if r is None or not _reads_ok(g, node, r[0], r[1], r[2], program):
        return None
    if not r[1] and r[2] and any(ld.buffer in g.roles for ld in reads(node.data.body)):
        return None  # a second pass over a whole tensor: separate kernels keep both passes parallel
    return r


def join(g: Group, k: int, node: ComputedBuffer, role: str, outer: tuple, inner: tuple | None) -> None:
    if g.inner is None and inner is not None:  # pointwise group becomes a row kernel
        n_full = len(outer) + len(inner)
        g.roles = {b: ("full" if len(_ranges_of(g, b)) == n_full else "outer") for b in g.roles}
    g.outer, g.inner = outer, inner
    g.members.append(k)
    g.roles[node.name] = role


def _ranges_of(g: Group, buffer: str) -> tuple:
    return g._ranges[buffer]  # type: ignore[attr-defined]


SAME_SPACE_LOOKBACK = 4  # how many earlier groups over the node's own iteration space it may join


def _index_space(by_space: dict[tuple, list[int]], g: Group, gi: int) -> None:
    for key in {tuple(g.outer), tuple(g.outer) + tuple(g.inner or ())}:
        lst = by_space.setdefault(key, [])
        if not lst or lst[-1] != gi:
            lst.append(gi)


def _candidates(groups: list[Group], by_space: dict[tuple, list[int]], node: ComputedBuffer,
                earliest: int) -> list[int]:
    """Groups ``node`` may join, latest first: the last LOOKBACK groups, plus the last few over its own
    iteration space however far back (an optimizer step updates p, m and v of one tensor in three
    nodes that sit many nodes apart; horizontal fusion makes them one kernel)."""
    d = node.data
    spaces = [tuple(d.ranges)]
    if isinstance(d, Reduction):
        spaces.append(tuple(d.ranges) + tuple(d.reduction_ranges))
    found = set(range(max(earliest, len(groups) - LOOKBACK, 0), len(groups)))
    for sp in spaces:
        found.update(gi for gi in by_space.get(sp, [])[-SAME_SPACE_LOOKBACK:] if gi >= earliest)
    return sorted(found, reverse=True)


def _reads_from(g: Group, node: ComputedBuffer) -> bool:
    """Whether ``node`` reads a value ``g`` computes. A node that does not (horizontal fusion) would
    be computed, and its buffer allocated, where ``g`` runs: across an extern call in between, that
    buffer stays alive through the extern's output. In a backward graph the values recomputed from
    saved tensors (ReLU outputs of ResNet-50, GELU outputs of ViT) were pulled, several into one
    kernel, far ahead of the convolution/matmul gradients that read them, and all lived at once."""
    data = node.data
    assert not isinstance(data, Scatter)  # (only pointwise and reduction nodes are fusion candidates)
    return any(ld.buffer in g.roles for ld in reads(data.body))


# horizontal fusion may still hoist a small value across an extern call (a weight converted to
# channels-last joins the previous weight's conversion kernel): one launch less, little memory
HOIST_MAX_ELEMENTS = 1 << 20


def _large(node: ComputedBuffer) -> bool:
    n = product(node.layout.shape)
    return not isinstance(n, (int, sympy.Integer)) or int(n) > HOIST_MAX_ELEMENTS


def group_nodes(p: LoopProgram, deps: Dependencies, options: InductorOptions) -> list[Group]:
    groups: list[Group] = []
    where: dict[str, int] = {}  # buffer -> group index
    by_space: dict[tuple, list[int]] = {}  # iteration space -> groups over it, in order
    last_extern = -1  # index of the latest extern group
    for k, node in enumerate(p.nodes):
        if isinstance(node, ExternKernel):
            g = Group((), None, [k], {}, extern=True)
            groups.append(g)
            last_extern = len(groups) - 1
            for o in node.outputs:
                where[o.buffer] = len(groups) - 1
            if node.target == WAIT_TENSOR:
                # the collective's output is ready only now: a later read of it (eager reads the tensor
                # it waited on) joins no kernel that runs before the wait
                for b in args_buffers(node.args):
                    where[b] = len(groups) - 1
            continue
        dep_groups = [where[b] for b in node_reads(node) if b in where]
        earliest = max(dep_groups, default=-1)
        chosen = None
        if options.fuse and isinstance(node.data, (Pointwise, Reduction)):
            for gi in _candidates(groups, by_space, node, earliest):
                if gi < last_extern and not _reads_from(groups[gi], node) and _large(node):
                    continue  # see _reads_from
                r = fits(groups[gi], node, p)
                if r is not None:
                    chosen = (gi, r)
                    break
        if chosen is None:
            d = node.data
            inner = tuple(d.reduction_ranges) if isinstance(d, Reduction) else None
            g = Group(tuple(d.ranges), inner, [], {}, extern=not isinstance(d, (Pointwise, Reduction)))
            g._ranges = {}  # type: ignore[attr-defined]
            groups.append(g)
            gi, role = len(groups) - 1, "outer"
            g.members.append(k)
            g.roles[node.name] = role
        else:
            gi, (role, outer, inner) = chosen
            join(groups[gi], k, node, role, outer, inner)
        groups[gi]._ranges[node.name] = tuple(node.data.ranges)  # type: ignore[attr-defined]
        where[node.name] = gi
        _index_space(by_space, groups[gi], gi)
    return groups
