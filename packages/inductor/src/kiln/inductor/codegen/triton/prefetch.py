"""Weights fetched into L2 before a kernel waits for the one before it (with PDL: pdl.py).

A decode step is a chain of one-row matmuls (a row kernel per projection: each program takes a few
output rows and reads those rows of the weight in full) with a few small kernels between them. Under
programmatic dependent launch the next kernel's programs are already resident while the kernel
before it finishes, waiting; the weights they will read do not depend on that kernel. So a program
first issues an L2 prefetch (``prefetch.global.L2``) for every 128-byte line of its weight rows, then
waits: the weight stream of the next matmul starts during the previous kernel's tail and ramp, where
the memory bus would idle, and its loads after the wait find the lines in L2.

A prefetch only moves a line into L2, the GPU's point of coherence for global memory: it never
yields a value to the program and cannot make one stale (a store by another kernel updates the
line in L2). So no ordering is loosened -- loads and stores still come after the wait. Which loads
qualify (``find_streams``): in a row kernel over one outer and one reduced dim with static sizes, a
read ``buffer[offset + stride * x0 + r0]`` (whole rows, contiguous along the reduced dim) made at
every point (not under a ``where`` branch) of a buffer the kernel does not produce; the backend keeps
those of graph inputs that no kernel of the graph writes (``read_only_streams``), at most
``MAX_BYTES`` per kernel (a weight larger than a good share of L2 would evict its own first lines:
the LM head).

A prefetching kernel lets the next kernel launch only after its own wait (pdl.py), so at most one
kernel ahead prefetches while another runs: the lines in flight are one kernel's weights, not every
resident kernel's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sympy

from ...ir import Expr, Kernel, Load, Op, children

LINE_BYTES = 128  # the L2 line a prefetch brings in
MAX_BYTES = 16 << 20  # weights prefetched per kernel, all programs together (H100/H200 L2: 50 MB)
MAX_PER_PROGRAM = 4096  # prefetch instructions one program issues (rows x lines), at most


@dataclass(frozen=True, slots=True)
class Stream:
    """A buffer a row kernel reads as whole rows: element ``offset + stride * x0 + r0`` for every output
    row ``x0 < rows`` and reduced index ``r0 < length``."""

    buffer: str
    stride: int
    offset: int
    rows: int
    length: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.length * self.itemsize


def _static(e: object) -> int | None:
    try:
        return int(sympy.sympify(e))
    except TypeError:
        return None


def _unconditional_loads(e: Expr) -> list[Load]:
    """The loads ``e`` evaluates at every point: not those under a ``where`` branch, which the IR allows to
    index out of range where the branch is not taken (cat, pad)."""
    out: list[Load] = []
    stack = [e]
    while stack:
        n = stack.pop()
        if isinstance(n, Load):
            out.append(n)
        stack.extend(n.args[:1] if isinstance(n, Op) and n.name == "where" else children(n))
    return out


def find_streams(k: Kernel) -> tuple[Stream, ...]:
    """The whole-row reads of ``k`` (a row kernel with one outer and one reduced dim of static sizes)."""
    if not k.is_row_kernel or len(k.outer) != 1 or len(k.inner) != 1:
        return ()
    rows, length = _static(k.outer[0]), _static(k.inner[0])
    if rows is None or length is None:
        return ()
    x0 = sympy.Symbol("x0", integer=True, nonnegative=True)
    r0 = sympy.Symbol("r0", integer=True, nonnegative=True)
    produced = {n.buffer for n in k.nodes}
    found: dict[str, Stream] = {}
    for n in k.nodes:
        for e in _unconditional_loads(n.body):
            if e.indirect or e.buffer in produced or e.buffer in found:
                continue
            ex = sympy.expand(e.index)
            if ex.free_symbols - {x0, r0} or ex.coeff(r0) != 1:
                continue
            stride, offset = ex.coeff(x0), ex.subs({x0: 0, r0: 0})
            if not (stride.is_Integer and offset.is_Integer) or int(stride) < length:
                continue  # rows overlap or the read is not linear in the two indices
            if sympy.expand(ex - stride * x0 - r0 - offset) != 0:
                continue
            found[e.buffer] = Stream(e.buffer, int(stride), int(offset), rows, length, e.dtype.itemsize)
    return tuple(found.values())


def read_only_streams(streams: Iterable[Stream], read_only: frozenset[str]) -> tuple[Stream, ...]:
    """The streams worth prefetching: of ``read_only`` buffers (graph inputs nothing in the graph writes),
    while their bytes stay under ``MAX_BYTES``."""
    kept: list[Stream] = []
    total = 0
    for s in streams:
        if s.buffer in read_only and total + s.nbytes <= MAX_BYTES:
            kept.append(s)
            total += s.nbytes
    return tuple(kept)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def prefetch_lines(streams: Iterable[Stream], pointers: dict[str, str], xblock: int) -> list[str]:
    """Kernel-body lines prefetching each stream's rows of this program into L2, one instruction per line of
    memory (the rows' first and last elements included, wherever the rows start), every line ending with
    the ``(pdl.py)`` mark ``without_pdl`` removes."""
    mark = "  # prefetch (pdl.py)"
    out: list[str] = []
    pid = "tl.program_id(0).to(tl.int64)"
    for i, s in enumerate(streams):
        per_line = max(1, LINE_BYTES // s.itemsize)
        points = -(-s.length // per_line) + 1  # one more: a row that starts mid-line ends in another
        if xblock * _pow2(points) > MAX_PER_PROGRAM:
            continue
        x, r = f"pf_x{i}", f"pf_r{i}"
        out += [
            f"{x} = tl.minimum({pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None], {s.rows - 1}){mark}",
            f"{r} = tl.minimum(tl.arange(0, {_pow2(points)})[None, :] * {per_line}, {s.length - 1}){mark}",
            f"tl.inline_asm_elementwise(\"prefetch.global.L2 [$1]; mov.u32 $0, 0;\", \"=r,l\", "
            f"[{pointers[s.buffer]} + ({s.offset} + {s.stride} * {x} + {r})], dtype=tl.int32, is_pure=False, "
            f"pack=1){mark}",
        ]
    return out
