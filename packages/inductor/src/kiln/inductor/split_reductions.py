"""Split reductions (Triton backend): few outputs, each over many elements, become two reductions.

A Triton reduction kernel runs one program per block of outputs, each looping over its whole
reduced range. BatchNorm's statistics in training reduce N*H*W elements (401,408 for ResNet-50's
first stage at batch 32) into one value per channel (64): 64 programs on a GPU with 132 SMs, each
streaming 800 KB alone, and the same again for BatchNorm's backward (sum of dy, sum of dy * x_hat)
and for bias gradients. Split: a partial reduction over (outputs x S chunks) writes S partial
results per output (fp32, the body's accumulation type), then a small reduction over the S partials
writes the original buffer, so consumers are unchanged. Sums are re-associated (as any parallel
reduction is); max/min/any/all are exact. argmax/argmin keep one pass (the index would need carrying).
The chunk boundary is a whole reduced dimension (the outermost one whose size has a fitting divisor),
so indices stay affine: ``r_k -> s * (d_k / S) + r_k``.
"""

from __future__ import annotations

import dataclasses

import sympy

from .ir import ComputedBuffer, Layout, Load, LoopProgram, Reduction, index_vars, substitute_index

SPLITTABLE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "any": "any", "all": "all"}
# Each split adds a kernel launch, and a host-bound training step (ResNet-50 with AMP on the H200) pays
# for every launch, so only reductions that leave the GPU mostly idle are split: splitting every long
# reduction saves device time but adds more host time than it saves
MIN_REDUCED = 16384  # elements per output below which one pass is fine
MAX_OUTPUTS = 512  # with this many outputs (programs) or more the one-pass kernel already fills the GPU
TARGET_PARTIALS = 2048  # outputs x chunks to aim for
MIN_CHUNK = 2048  # elements per partial: fewer and the second pass plus the extra kernel dominate


def split_reductions(program: LoopProgram) -> tuple[LoopProgram, int]:
    """``program`` with its long few-output reductions split, and how many were split."""
    taken = {b.name for b in program.inputs} | {n.name for n in program.nodes if isinstance(n, ComputedBuffer)}
    nodes: list = []
    count = 0
    for n in program.nodes:
        parts = _split(n, taken) if isinstance(n, ComputedBuffer) and isinstance(n.data, Reduction) else None
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
    total = 1
    for d in reduced:
        total *= d
    if total < MIN_REDUCED or outputs >= MAX_OUTPUTS:
        return None
    want = min(-(-TARGET_PARTIALS // outputs), total // MIN_CHUNK)
    if want < 2:
        return None
    for k, d in enumerate(reduced):
        best = max((s for s in range(2, min(d, want) + 1) if d % s == 0), default=0)
        if best >= max(2, want // 4):
            return k, best
    return None


def _split(n: ComputedBuffer, taken: set[str]) -> tuple[ComputedBuffer, ComputedBuffer] | None:
    d = n.data
    assert isinstance(d, Reduction)
    final_type = SPLITTABLE.get(d.reduction_type)
    if final_type is None or not all(isinstance(s, sympy.Integer) for s in (*d.ranges, *d.reduction_ranges)):
        return None
    outputs = 1
    for s in d.ranges:
        outputs *= int(s)
    choice = chunks_for(outputs, tuple(int(s) for s in d.reduction_ranges))
    if choice is None:
        return None
    k, chunks = choice
    inner = int(d.reduction_ranges[k]) // chunks
    ivars = index_vars("i", len(d.ranges) + 1)
    rk = index_vars("r", len(d.reduction_ranges))[k]
    body = substitute_index(d.body, {rk: ivars[-1] * inner + rk})
    acc = d.body.dtype
    name = _fresh(f"{n.name}_part", taken)
    part_shape = (*d.ranges, sympy.Integer(chunks))
    part_layout = Layout.contiguous(part_shape, acc, n.layout.device)
    rranges = tuple(sympy.Integer(inner) if j == k else s for j, s in enumerate(d.reduction_ranges))
    partial = ComputedBuffer(name, part_layout, Reduction(part_shape, rranges, d.reduction_type, body), n.origins)
    r0 = index_vars("r", 1)[0]
    load = Load(name, part_layout.index((*ivars[:-1], r0)), acc)
    final = ComputedBuffer(n.name, n.layout, Reduction(d.ranges, (sympy.Integer(chunks),), final_type, load),
                           n.origins)
    return partial, final


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name
