"""One arena per call: the program's intermediate buffers at offsets planned here, instead of one
allocator block each.

Why: a CUDA graph's private pool is the caching allocator's segments, and their rounding (2 MB
segments for small blocks, 20 MB for 1-10 MB ones) and best-fit holes made inference pools
1.2-1.5x the bytes the same graph ever has allocated at once. With an arena the pool holds one
block of the planned size (greedy by size over lifetimes, within a few percent of the most bytes
live at once), plus what ATen still allocates itself: extern calls without an ``out=`` form
(attention, fallbacks), the workspaces of those with one (cuDNN's), and the graph's outputs unless
they are most of the arena (then they join it: ``OUTPUTS_INSIDE``).

A *storage* is a buffer the wrapper allocates (or an extern call with an ``out=`` form writes)
together with the buffers a kernel writes over it in place (``Kernel.inplace``). The memory plan's
other hand-overs (a dead buffer's memory to a new one of the same size) are planned anew here, each
buffer a storage of its own: the offsets reuse memory across sizes and dtypes too. It lives from
the step of its first allocation through the step its last member is freed (inclusive: a step's
work still reads what it frees); a returned one, through the end. Storages whose memory escapes are
left to the allocator: one member is never freed (and not returned), or is an argument of an extern
call that may return its memory under another name (an in-place op, a view).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..ir import (
    WAIT_TENSOR,
    ExternKernel,
    Kernel,
    KernelGroup,
    Layout,
    ScheduledProgram,
    TensorRef,
    args_buffers,
)
from .memory import layout_bytes

ALIGN = 512  # the caching allocator's block alignment: kernels' pointer alignment stays what it was


# extern calls that can write into the arena (``out=``) when their one output is dense: matmuls
# through ATen's out= overloads and kiln's padded matmul; 2-D convolutions through cuDNN's or the
# depthwise kernel's out= overload where ATen would pick that backend (program_helpers.conv_out)
OUT_FORMS = {f"aten.{op}.default": f"torch.ops.aten.{op}.out" for op in ("mm", "addmm", "bmm", "baddbmm")}
OUT_FORMS["kiln_inductor.mm_padded.default"] = "_mm_padded"  # graph_passes/pad_matmuls.py: a language model's logits
CONVOLUTION = "aten.convolution.default"


def _channels_last(layout: Layout) -> bool:
    if len(layout.shape) != 4:
        return False
    n, c, h, w = (int(x) for x in layout.shape)
    return tuple(int(x) for x in layout.stride) == (h * w * c, 1, w * c, c)


def writes_out(e: ExternKernel) -> bool:
    """The call can write its one output into memory the wrapper gives it."""
    if len(e.outputs) != 1 or e.outputs[0].path:
        return False
    lay = e.outputs[0].layout
    if e.target in OUT_FORMS:
        return lay.is_contiguous
    return (e.target == CONVOLUTION and not e.kwargs and len(e.args) == 9 and len(lay.shape) == 4
            and (lay.is_contiguous or _channels_last(lay)))


@dataclass(frozen=True, slots=True)
class ArenaPlan:
    size: int  # bytes of the arena
    offsets: dict[str, int]  # storage root buffer -> byte offset
    roots: dict[str, str]  # every buffer placed in the arena -> its storage's root
    live_peak: int  # most bytes (aligned) of arena storages live at once: the lower bound of ``size``
    spans: dict[str, tuple[int, int, int]]  # root -> (first step, last step, bytes)
    # bytes to leave free right after the arena in its allocator segment (``tail``): what the call
    # allocates beside it outside the plan (outputs of calls without an ``out=`` form, outputs kept
    # apart) at most at once, plus room for a library's workspace (``WORKSPACE``)
    tail: int = 0


def returns_alias(target: str) -> bool:
    """An ATen op that may return (part of) an argument's memory: in-place, ``out=`` or a view, or
    ``wait_tensor`` (returns its argument; its schema does not say so). Unknown ops count as aliasing."""
    if target == WAIT_TENSOR:
        return True
    ns, op, overload = (target.split(".", 2) + ["", ""])[:3]
    try:
        schema = getattr(getattr(getattr(torch.ops, ns), op), overload)._schema
    except (AttributeError, RuntimeError):
        return True
    return any(r.alias_info is not None for r in schema.returns) or any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_arena(s: ScheduledProgram) -> ArenaPlan:
    """Offsets for every storage that can live in the arena. The graph's outputs join it when they
    are most of it (``OUTPUTS_INSIDE``): a language model's logits, allocated last, would otherwise
    sit beside an arena sized for the layers' earlier peak."""
    p = s.program
    layouts = p.layouts()  # type: ignore[attr-defined]
    inputs = {b.name for b in p.inputs} | ({p.seed_buffer} if p.seed_buffer else set())  # type: ignore[attr-defined]
    outputs = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}  # type: ignore[attr-defined]
    root: dict[str, str] = {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    escapes: set[str] = set()
    freed: set[str] = set()
    for k, st in enumerate(s.steps):
        w = st.work
        pairs = set(w.inplace) if isinstance(w, (Kernel, KernelGroup)) else set()
        for a in st.allocate:
            if (a.buffer, a.reuse) not in pairs:  # new memory, or a dead buffer's: placed anew here
                root[a.buffer] = a.buffer
                start[a.buffer] = k
            elif a.reuse in root:  # written over its input by the same kernel: the input's storage
                root[a.buffer] = root[a.reuse]
        if isinstance(w, ExternKernel):
            if writes_out(w):
                b = w.outputs[0].buffer
                root[b] = b
                start[b] = k
            if returns_alias(w.target):
                escapes.update(root[b] for b in args_buffers(w.args) + args_buffers(tuple(v for _, v in w.kwargs))
                               if b in root)
        for b in st.free:
            if b in root:
                freed.add(b)
                end[root[b]] = max(end.get(root[b], k), k)
    returned = {root[b] for b in outputs if b in root}
    for b, r in root.items():
        if b in inputs or (b not in freed and b not in outputs):
            escapes.add(r)
    size_of: dict[str, int] = {}
    for b, r in root.items():
        size_of[r] = max(size_of.get(r, 0), _aligned(layout_bytes(layouts[b])))
    inner = [r for r in start if r not in escapes and r not in returned and r in end]
    plan = _pack(inner, size_of, {r: (start[r], end[r]) for r in inner})
    last = len(s.steps)
    out = [r for r in start if r in returned and r not in escapes]
    out_bytes = sum(size_of[r] for r in out)
    if out:
        both = _pack(inner + out, size_of, {**{r: (start[r], end[r]) for r in inner},
                                            **{r: (start[r], last) for r in out}})
        # the returned storages hold the whole arena while the caller keeps them: only worth it when
        # the arena is then little more than those outputs, and smaller than the two apart
        if both.size - out_bytes <= OUTPUTS_INSIDE * out_bytes and both.size < plan.size + out_bytes:
            plan = both
    roots = {b: r for b, r in root.items() if r in plan.offsets}
    beside = _beside(s, roots, layouts, outputs)
    tail = beside + WORKSPACE if plan.size + beside >= TAIL_FROM else 0
    return replace(plan, roots=roots, tail=tail)


# The caching allocator serves a 1-10 MB request from a 20 MB segment of its own when no free block
# fits, so one attention output or cuDNN workspace beside the arena cost a 20 MB segment. A call
# being recorded first takes and frees one block of arena + ``tail`` bytes and then carves the arena
# from it (program_helpers.take_arena): requests up to ``tail`` fit the rest of that segment. The
# workspace share is a guess (MobileNetV3's cuDNN workspaces were 2.4-3.3 MB); larger ones still take
# a segment. Arenas under ``TAIL_FROM`` sit in a 20 MB segment anyway.
WORKSPACE = 4 << 20
TAIL_FROM = 10 << 20
_LARGE = 1 << 20  # requests up to 1 MB come from the allocator's small-block segments


def _beside(s: ScheduledProgram, roots: dict[str, str], layouts: dict[str, Layout], outputs: set[str]) -> int:
    """The most bytes of large blocks outside the arena the wrapper's steps hold at once: extern
    outputs written without ``out=`` and kernel outputs kept apart (graph outputs until the end)."""
    born: dict[str, int] = {}
    for k, st in enumerate(s.steps):
        for a in st.allocate:
            if a.buffer not in roots and (a.reuse is None or a.reuse in roots):
                born[a.buffer] = k
        if isinstance(st.work, ExternKernel):
            for o in st.work.outputs:
                if o.buffer not in roots:
                    born[o.buffer] = k
    died = {b: k for k, st in enumerate(s.steps) for b in st.free}
    events: dict[int, int] = {}
    for b, k in born.items():
        n = layout_bytes(layouts[b])
        if n <= _LARGE:
            continue
        last = len(s.steps) if b in outputs or b not in died else died[b]
        events[k] = events.get(k, 0) + n
        events[last + 1] = events.get(last + 1, 0) - n
    most = now = 0
    for k in sorted(events):
        now += events[k]
        most = max(most, now)
    return most


# outputs join the arena when it is then at most this much larger than they are
OUTPUTS_INSIDE = 0.25


def _pack(storages: list[str], size_of: dict[str, int], span: dict[str, tuple[int, int]]) -> ArenaPlan:
    """Greedy by size: largest first (then earliest), each at the lowest offset free of every placed
    storage it overlaps in time."""
    offsets: dict[str, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # (offset, bytes, start, end)
    for r in sorted(storages, key=lambda r: (-size_of[r], span[r][0], r)):
        n, (lo, hi) = size_of[r], span[r]
        busy = sorted((o, o + m) for o, m, s0, e0 in placed if s0 <= hi and lo <= e0)
        at = 0
        for o0, o1 in busy:
            if at + n <= o0:
                break
            at = max(at, o1)
        offsets[r] = at
        placed.append((at, n, lo, hi))
    size = max((o + m for o, m, _, _ in placed), default=0)
    events: dict[int, int] = {}
    for r in storages:
        events[span[r][0]] = events.get(span[r][0], 0) + size_of[r]
        events[span[r][1] + 1] = events.get(span[r][1] + 1, 0) - size_of[r]
    peak = run = 0
    for k in sorted(events):
        run += events[k]
        peak = max(peak, run)
    return ArenaPlan(size, offsets, {}, peak, {r: (*span[r], size_of[r]) for r in storages})
