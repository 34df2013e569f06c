"""Split reductions (Triton backend): few outputs, each over many elements, become two reductions.

A Triton reduction kernel runs one program per block of outputs, each looping over its whole
reduced range. BatchNorm's statistics in training reduce N*H*W elements (401,408 for ResNet-50's
first stage at batch 32) into one value per channel (64): 64 programs on a GPU with 132 SMs, each
streaming 800 KB alone, and the same again for BatchNorm's backward (sum of dy, sum of dy * x_hat)
and for bias gradients. Split: a partial reduction over (outputs x S chunks) writes S partial
results per output (fp32, the body's accumulation type), then a small reduction over the S partials
writes the original buffer, so consumers are unchanged. Sums are re-associated (as any parallel
reduction is); max/min/any/all are exact. argmax/argmin over static sizes split on their outermost reduced
dim: the partial pass writes each chunk's extremum and its index (one kernel), the final pass picks the
chunk whose extremum wins and reads its index back (the first chunk on ties and NaN, as the first index
wins inside a chunk: torch's answer); decode's greedy argmax over a 32,000-word vocabulary ran in one
program for 13 us a token on an H100. The chunk boundary is a whole reduced dimension (the outermost one
whose size has a fitting divisor), so indices stay affine: ``r_k -> s * (d_k / S) + r_k``.

Column reductions (the reduced dim is not the contiguous one: bias and norm-weight gradients over a
transformer's tokens, channels-last statistics) are split whenever their one-pass kernel would leave the
GPU idle, whatever their number of outputs: its programs each take a few adjacent outputs (8 by default)
and loop over every row, so ViT-B/16's bias gradients (768 outputs over 6,304 tokens) ran on 96 programs
for 22-100 us on an H100. Their partial puts the chunk index outermost (``[S, outputs]``), so the partial
pass is again a column reduction whose programs read wide runs of adjacent outputs of S row blocks.

Symbolic sizes: whether to split is decided at the size hints; the split is correct for every size.
With several reduced ranges (NCHW BatchNorm: batch, then the merged image) the partial pass reduces the
innermost range at every outer position and the final pass the outer positions. With one (or an
innermost range too short to be worth a program), S chunks (a constant from the hints) of
``ceil(total / S)`` elements of the flattened reduced range, the reduced indices recovered by division
and modulo and the tail masked with the reduction's identity (an empty chunk contributes the identity).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import sympy
import torch

from .ir import (
    ComputedBuffer,
    Layout,
    Load,
    LoopProgram,
    Pointwise,
    Reduction,
    index_var,
    index_vars,
    substitute_index,
)
from .ir.expr import Constant, Expr, IndexValue, cast, op, walk
from .ir.index import FloorDiv, ModIndex, product, walks_rows

SPLITTABLE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "any": "any", "all": "all"}
EXTREMUM = {"argmax": "max", "argmin": "min"}  # the value an arg-reduction's chunks are compared by
# Each split adds a kernel launch, and a host-bound training step (ResNet-50 with AMP on the H200) pays
# for every launch, so only reductions that leave the GPU mostly idle are split: splitting every long
# reduction saves device time but adds more host time than it saves
MIN_REDUCED = 16384  # elements per output below which one pass is fine
MAX_OUTPUTS = 512  # with this many outputs (programs) or more the one-pass kernel already fills the GPU
TARGET_PARTIALS = 2048  # outputs x chunks to aim for
MIN_CHUNK = 2048  # elements per partial: fewer and the second pass plus the extra kernel dominate
# Column reductions: a program reads COL_WIDTH adjacent outputs per row at least (fewer and the reads are
# narrower than a 32-byte sector); split when the one-pass kernel has fewer than COL_MAX_OUTPUTS outputs and
# reads at least COL_MIN_ELEMENTS, into chunks of at least COL_MIN_ROWS rows, aiming at COL_TARGET
# partial outputs (the partial pass then takes 32-64 adjacent outputs a program over 500-800 programs)
COL_WIDTH = 32
COL_MAX_OUTPUTS = 16384
COL_MIN_ELEMENTS = 1 << 20
COL_MIN_ROWS = 32
COL_TARGET = 32768


def split_reductions(program: LoopProgram) -> tuple[LoopProgram, int]:
    """``program`` with its long few-output reductions split, and how many were split."""
    taken = {b.name for b in program.inputs} | {n.name for n in program.nodes if isinstance(n, ComputedBuffer)}
    hints = program.hints
    nodes: list = []
    count = 0
    for n in program.nodes:
        parts = _split(n, taken, hints) if isinstance(n, ComputedBuffer) and isinstance(n.data, Reduction) else None
        if parts is None:
            nodes.append(n)
        else:
            nodes.extend(parts)
            count += 1
    if not count:
        return program, 0
    return dataclasses.replace(program, nodes=tuple(nodes)), count


def chunks_for(outputs: int, reduced: tuple[int, ...]) -> tuple[int, int] | None:
    """(reduced dim to split, number of chunks S) for a reduction of ``outputs`` values each over
    ``reduced`` (sizes, outermost first), or None when one pass is the better kernel."""
    want = _row_chunks(outputs, math.prod(reduced))
    if want is None:
        return None
    for k, d in enumerate(reduced):
        best = max((s for s in range(2, min(d, want) + 1) if d % s == 0), default=0)
        if best >= max(2, want // 4):
            return k, best
    return None


def column_plan(outputs: int, reduced: tuple[int, ...]) -> tuple[int, ...] | None:
    """How to chunk a column reduction of ``outputs`` adjacent values over ``reduced`` rows (sizes,
    outermost first): a number of chunks per reduced dim, each a divisor of its dim, taken from the
    outermost dim in (a whole dim where it fits), at most as many in all as column_chunks wants; None:
    one pass. ``(197, 8)`` rows (sequence-first) chunk the inner dim: ``(1, 8)``."""
    want = column_chunks(outputs, math.prod(reduced)) if outputs >= COL_WIDTH else None
    if want is None:
        return None
    plan, taken = [], 1
    for d in reduced:
        c = max(c for c in range(1, want // taken + 1) if d % c == 0)
        plan.append(c)
        taken *= c
    return tuple(plan) if taken >= 2 else None


def _row_chunks(outputs: int, total: int) -> int | None:
    if total < MIN_REDUCED or outputs >= MAX_OUTPUTS:
        return None
    want = min(-(-TARGET_PARTIALS // outputs), total // MIN_CHUNK)
    return want if want >= 2 else None


def column_chunks(outputs: int, total: int) -> int | None:
    """Chunks S wanted for a column reduction of ``outputs`` adjacent values each over ``total`` rows."""
    if outputs >= COL_MAX_OUTPUTS or (outputs * total < COL_MIN_ELEMENTS and total < MIN_REDUCED):
        return None
    want = min(-(-COL_TARGET // outputs), total // COL_MIN_ROWS)
    return want if want >= 2 else None


def flat_chunks_for(outputs: int, total: int, column: bool = False) -> int | None:
    """Number of chunks S of the flattened reduced range (sizes at their hints), or None."""
    return column_chunks(outputs, total) if column and outputs >= COL_WIDTH else _row_chunks(outputs, total)


def walks_columns(d: Reduction) -> bool:
    """Whether ``d``'s loads walk memory along its outputs rather than its reduced range (a column
    reduction), by the rule the Triton kernel's blocks follow."""
    if not d.ranges or not d.reduction_ranges:
        return False
    loads = (e.index for e in walk(d.body) if isinstance(e, Load))
    return not walks_rows(loads, index_var("i", len(d.ranges) - 1), index_var("r", len(d.reduction_ranges) - 1))


class _Chunks(NamedTuple):
    """A static reduction cut into ``chunks`` of its reduced dim ``k``: the partial pass's body (the
    chunk index is the last of ``ivars``), output shape and reduced ranges."""

    k: int
    chunks: int
    ivars: tuple[sympy.Symbol, ...]
    body: Expr
    part_shape: tuple[sympy.Expr, ...]
    rranges: tuple[sympy.Expr, ...]


def _static_chunks(d: Reduction) -> _Chunks | None:
    """How to split ``d`` (static sizes; chunks_for decides), or None."""
    outputs = math.prod(int(s) for s in d.ranges)
    choice = chunks_for(outputs, tuple(int(s) for s in d.reduction_ranges))
    if choice is None:
        return None
    k, chunks = choice
    inner = int(d.reduction_ranges[k]) // chunks
    ivars = index_vars("i", len(d.ranges) + 1)
    rk = index_vars("r", len(d.reduction_ranges))[k]
    body = substitute_index(d.body, {rk: ivars[-1] * inner + rk})
    rranges = tuple(sympy.Integer(inner) if j == k else s for j, s in enumerate(d.reduction_ranges))
    return _Chunks(k, chunks, ivars, body, (*d.ranges, sympy.Integer(chunks)), rranges)


def _split(n: ComputedBuffer, taken: set[str], hints: dict[str, int]) -> tuple[ComputedBuffer, ...] | None:
    d = n.data
    assert isinstance(d, Reduction)
    static = all(isinstance(s, sympy.Integer) for s in (*d.ranges, *d.reduction_ranges))
    if d.reduction_type in EXTREMUM:
        return _split_arg(n, d, taken) if static else None
    final_type = SPLITTABLE.get(d.reduction_type)
    if final_type is None:
        return None
    column = walks_columns(d)
    if not static:
        return _split_symbolic(n, d, final_type, taken, hints, column)
    if column and math.prod(int(s) for s in d.ranges) >= COL_WIDTH:  # narrower: split as rows
        return _split_columns(n, d, final_type, taken)
    c = _static_chunks(d)
    if c is None:
        return None
    acc = d.body.dtype
    name = _fresh(f"{n.name}_part", taken)
    part_layout = Layout.contiguous(c.part_shape, acc, n.layout.device)
    partial = ComputedBuffer(name, part_layout, Reduction(c.part_shape, c.rranges, d.reduction_type, c.body), n.origins)
    r0 = index_vars("r", 1)[0]
    load = Load(name, part_layout.index((*c.ivars[:-1], r0)), acc)
    final = ComputedBuffer(n.name, n.layout, Reduction(d.ranges, (sympy.Integer(c.chunks),), final_type, load),
                           n.origins)
    return partial, final


def _split_columns(n: ComputedBuffer, d: Reduction, final_type: str,
                   taken: set[str]) -> tuple[ComputedBuffer, ComputedBuffer] | None:
    """A static column reduction in chunks (column_plan): the partial's outputs are [chunk dims...,
    outputs] (the outputs stay innermost, so contiguous), the final reduces the chunk dims."""
    rdims = tuple(int(s) for s in d.reduction_ranges)
    plan = column_plan(math.prod(int(s) for s in d.ranges), rdims)
    if plan is None:
        return None
    chunked = [j for j, c in enumerate(plan) if c > 1]
    kept = [j for j, c in enumerate(plan) if c < rdims[j]]  # dims the partial still reduces (in part)
    nc = len(chunked)
    ivars, rv = index_vars("i", nc + len(d.ranges)), index_vars("r", len(rdims))
    mapping: dict[sympy.Symbol, sympy.Expr] = {index_var("i", j): ivars[nc + j] for j in range(len(d.ranges))}
    for j in range(len(rdims)):
        inner = rdims[j] // plan[j]
        own = rv[kept.index(j)] if j in kept else sympy.Integer(0)
        mapping[rv[j]] = ivars[chunked.index(j)] * inner + own if j in chunked else own
    acc = d.body.dtype
    part_shape = (*(sympy.Integer(plan[j]) for j in chunked), *d.ranges)
    rest = tuple(sympy.Integer(rdims[j] // plan[j]) for j in kept)
    name = _fresh(f"{n.name}_part", taken)
    part_layout = Layout.contiguous(part_shape, acc, n.layout.device)
    partial = Reduction(part_shape, rest, d.reduction_type, substitute_index(d.body, mapping))
    load = Load(name, part_layout.index((*rv[:nc], *index_vars("i", len(d.ranges)))), acc)
    final = Reduction(d.ranges, part_shape[:nc], final_type, load)
    return ComputedBuffer(name, part_layout, partial, n.origins), ComputedBuffer(n.name, n.layout, final, n.origins)


def _split_arg(n: ComputedBuffer, d: Reduction, taken: set[str]) -> tuple[ComputedBuffer, ...] | None:
    """argmax/argmin over static sizes in chunks of its outermost reduced dim: each chunk's extremum and
    index (one partial kernel), then the winning chunk and its index plus the chunk's offset."""
    c = _static_chunks(d)
    if c is None or c.k != 0:  # a chunk of the outermost dim: its flat indices are contiguous
        return None
    span = math.prod(int(s) for s in c.rranges)  # the flat indices a chunk covers
    dev = n.layout.device
    vals = ComputedBuffer(_fresh(f"{n.name}_pval", taken), Layout.contiguous(c.part_shape, d.body.dtype, dev),
                          Reduction(c.part_shape, c.rranges, EXTREMUM[d.reduction_type], c.body), n.origins)
    idxs = ComputedBuffer(_fresh(f"{n.name}_pidx", taken), Layout.contiguous(c.part_shape, torch.int64, dev),
                          Reduction(c.part_shape, c.rranges, d.reduction_type, c.body), n.origins)
    outer, r0 = c.ivars[:-1], index_vars("r", 1)[0]
    winner = ComputedBuffer(_fresh(f"{n.name}_chunk", taken), Layout.contiguous(d.ranges, torch.int64, dev),
                            Reduction(d.ranges, (sympy.Integer(c.chunks),), d.reduction_type,
                                      Load(vals.name, vals.layout.index((*outer, r0)), d.body.dtype)), n.origins)
    chunk = Load(winner.name, winner.layout.index(tuple(outer)), torch.int64)
    local = Load(idxs.name, idxs.layout.index((*outer, index_var("d", 0))), torch.int64, (chunk,))
    index = op("add", local, op("mul", chunk, Constant(span, torch.int64), dtype=torch.int64), dtype=torch.int64)
    final = ComputedBuffer(n.name, n.layout, Pointwise(d.ranges, cast(index, n.layout.dtype)), n.origins)
    return vals, idxs, winner, final


def _at_hints(e: sympy.Expr, hints: dict[str, int]) -> int | None:
    v = e.subs({s: hints[s.name] for s in e.free_symbols if s.name in hints})
    return int(v) if isinstance(v, sympy.Integer) else None


def _split_symbolic(n: ComputedBuffer, d: Reduction, final_type: str, taken: set[str],
                    hints: dict[str, int], column: bool) -> tuple[ComputedBuffer, ComputedBuffer] | None:
    """The split of a reduction over symbolic sizes, chosen at the size hints and correct for every size.
    Several reduced ranges (NCHW BatchNorm: batch, then the merged image): the partial reduces the
    innermost range for every outer position, the final pass the outer positions, so no index is divided
    by a symbolic size per element (a 64-bit division by a run-time value costs more than the load).
    One reduced range (NHWC, or a long flat range) or a column reduction: S chunks of ``ceil(total / S)``
    elements each, the tail masked with the reduction's identity."""
    outputs, total = _at_hints(product(d.ranges), hints), _at_hints(product(d.reduction_ranges), hints)
    chunks = None if outputs is None or total is None else flat_chunks_for(outputs, total, column)
    if chunks is None:
        return None
    name = _fresh(f"{n.name}_part", taken)
    acc = d.body.dtype
    *outer, last = d.reduction_ranges
    inner = _at_hints(last, hints)
    if outer and inner is not None and inner >= MIN_CHUNK // 4 and not column:
        ivars = index_vars("i", len(d.ranges) + len(outer))
        rvars = index_vars("r", len(d.reduction_ranges))
        mapping = {rvars[j]: ivars[len(d.ranges) + j] for j in range(len(outer))}
        mapping[rvars[-1]] = rvars[0]
        body = substitute_index(d.body, mapping)
        part_shape = (*d.ranges, *outer)
        part_layout = Layout.contiguous(part_shape, acc, n.layout.device)
        partial = Reduction(part_shape, (last,), d.reduction_type, body)
        load = Load(name, part_layout.index((*ivars[:len(d.ranges)], *rvars[:len(outer)])), acc)
        final = Reduction(d.ranges, tuple(outer), final_type, load)
    else:
        partial, final, part_layout = _flat_split(n, d, chunks, name, column)
    return (ComputedBuffer(name, part_layout, partial, n.origins),
            ComputedBuffer(n.name, n.layout, final, n.origins))


def _flat_split(n: ComputedBuffer, d: Reduction, chunks: int, name: str,
                column: bool) -> tuple[Reduction, Reduction, Layout]:
    total = product(d.reduction_ranges)
    chunk = FloorDiv(total + chunks - 1, chunks)
    ivars = index_vars("i", len(d.ranges) + 1)
    r0 = index_vars("r", 1)[0]
    s, outer = (ivars[0], ivars[1:]) if column else (ivars[-1], ivars[:-1])
    flat = s * chunk + r0
    rvars = index_vars("r", len(d.reduction_ranges))
    mapping: dict[sympy.Symbol, sympy.Expr] = dict(zip(ivars[:-1], outer, strict=True)) if column else {}
    inner: sympy.Expr = sympy.Integer(1)
    for k in reversed(range(len(d.reduction_ranges))):
        q = FloorDiv(flat, inner) if inner != 1 else flat
        mapping[rvars[k]] = q if k == 0 else ModIndex(q, d.reduction_ranges[k])
        inner = inner * d.reduction_ranges[k]
    acc = d.body.dtype
    inside = op("lt", IndexValue(flat, torch.int64), IndexValue(total, torch.int64), dtype=torch.bool)
    body = op("where", inside, substitute_index(d.body, mapping), _identity(d.reduction_type, acc), dtype=acc)
    part_shape = (sympy.Integer(chunks), *d.ranges) if column else (*d.ranges, sympy.Integer(chunks))
    part_layout = Layout.contiguous(part_shape, acc, n.layout.device)
    load = Load(name, part_layout.index((r0, *ivars[:-1]) if column else (*ivars[:-1], r0)), acc)
    final_type = SPLITTABLE[d.reduction_type]
    return (Reduction(part_shape, (chunk,), d.reduction_type, body),
            Reduction(d.ranges, (sympy.Integer(chunks),), final_type, load), part_layout)


def _identity(reduction_type: str, dtype: torch.dtype) -> Expr:
    """The value a masked element contributes: 0 to a sum, 1 to a product, the far end of the dtype's
    range to max / min, False to any, True to all."""
    if reduction_type in ("sum", "prod"):
        return Constant(0 if reduction_type == "sum" else 1, dtype) if not dtype.is_floating_point \
            else Constant(0.0 if reduction_type == "sum" else 1.0, dtype)
    if reduction_type in ("any", "all"):
        return Constant(reduction_type == "all", dtype) if dtype == torch.bool \
            else Constant(int(reduction_type == "all"), dtype)
    low = reduction_type == "max"
    if dtype.is_floating_point:
        return Constant(float("-inf") if low else float("inf"), dtype)
    if dtype == torch.bool:
        return Constant(not low, dtype)
    info = torch.iinfo(dtype)
    return Constant(info.min if low else info.max, dtype)


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name
