"""Memory planning: allocate each stored buffer just before its first writer, free it after its last
reader, and hand a dead buffer's storage to a new buffer of the same size and dtype where keeping it
until then does not raise the program's peak. A view an extern call returns and the buffer it views are
one storage (``shared_storage``): dead after both names."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..ir import (
    WAIT_TENSOR,
    Allocation,
    ExternKernel,
    Kernel,
    KernelGroup,
    Layout,
    LoopProgram,
    ScheduledProgram,
    Step,
    TensorRef,
    args_buffers,
    product,
    work_buffers,
)


def _nbytes(layout: Layout) -> object:
    if not layout.is_contiguous:
        return None  # non-contiguous layouts are not reused (storage extent differs from numel)
    return (layout.dtype, product(layout.shape))


def _in_place(target: str) -> bool:
    """``aten.div_.Scalar`` and the like: ATen's in-place overloads end in an underscore."""
    parts = target.split(".")
    return len(parts) >= 2 and parts[1].endswith("_") and (not parts[1].endswith("__") or parts[1].startswith("__i"))


@functools.cache
def view_argument(target: str) -> int | None:
    """The position of the argument an ATen op returns a view of (``Tensor(a) self -> Tensor(a)``,
    no write), if any: a fallback ``view_as_complex``/``unfold``; ``wait_tensor`` returns its
    argument itself (its schema does not say so)."""
    if target == WAIT_TENSOR:
        return 0
    ns, op, overload = (target.split(".", 2) + ["", ""])[:3]
    try:
        schema = getattr(getattr(getattr(torch.ops, ns), op), overload)._schema
    except (AttributeError, RuntimeError):
        return None
    sets = {frozenset(r.alias_info.before_set) for r in schema.returns
            if r.alias_info is not None and not r.alias_info.is_write}
    for k, a in enumerate(schema.arguments):
        if a.alias_info is not None and not a.alias_info.is_write and frozenset(a.alias_info.before_set) in sets:
            return None if a.kwarg_only else k
    return None


def shared_storage(works: Sequence[Kernel | KernelGroup | ExternKernel]) -> dict[str, str]:
    """Buffers that are another buffer's memory under a new name: each output of an extern call that
    returns a view of (or, ``wait_tensor``, the very) argument -> the buffer owning that memory."""
    out: dict[str, str] = {}
    for w in works:
        if not isinstance(w, ExternKernel) or not w.outputs:
            continue
        k = view_argument(w.target)
        src = args_buffers(w.args[k:k + 1]) if k is not None else []
        if src:
            for o in w.outputs:
                out[o.buffer] = out.get(src[0], src[0])
    return out


def storage_groups(works: Sequence[Kernel | KernelGroup | ExternKernel]) -> list[list[str]]:
    """Names of one storage (``shared_storage``), each group's first the buffer that owns the memory."""
    groups: dict[str, list[str]] = {}
    for out, src in shared_storage(works).items():
        groups.setdefault(src, [src]).append(out)
    return list(groups.values())


def plan_memory(p: LoopProgram, works: Sequence[Kernel | KernelGroup | ExternKernel]) -> list[Step]:
    layouts = p.layouts()
    outputs = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    inputs = {b.name for b in p.inputs} | ({p.seed_buffer} if p.seed_buffer else set())
    # every buffer each step names, an extern call's new outputs included
    used = [work_buffers(w) + ([o.buffer for o in w.outputs] if isinstance(w, ExternKernel) else []) for w in works]
    last_use = {b: k for k, names in enumerate(used) for b in names}
    # an in-place ATen fallback (bernoulli_, div_) returns its argument's storage under a new name:
    # the argument's name dies there, its memory does not, so it must never be handed on for reuse
    aliased = {b for w in works if isinstance(w, ExternKernel) and _in_place(w.target)
               for b in args_buffers(w.args)}
    # a view returned by an extern call (a fallback view_as_complex; a wait_tensor returns a
    # collective's output itself) and the buffer it views are one storage: alive until the last
    # name's last use, and its memory handed on once, under the owner's name
    groups = storage_groups(works)
    for members in groups:
        last = max(last_use[b] for b in members)
        for b in members:
            last_use[b] = last
        kept = any(b in outputs or b in inputs for b in members)
        aliased.update(members if kept else members[1:])
    dying: dict[int, list[str]] = {}  # step -> buffers last used there (in last_use's order)
    for b, last in last_use.items():
        dying.setdefault(last, []).append(b)
    # the bytes each step holds without reuse (a view's storage counted once, under its owner)
    live = _live_bytes(used, layouts, last_use, inputs | {b for m in groups for b in m[1:]}, outputs)
    ceiling = max(live, default=0)
    pool: dict[object, list[tuple[str, int]]] = {}  # (bytes, dtype) -> (dead buffer, step it died in)
    steps: list[Step] = []
    for k, w in enumerate(works):
        allocs: list[Allocation] = []
        if isinstance(w, Kernel):
            for b in w.outputs:
                key = _nbytes(layouts[b])
                allocs.append(Allocation(b, layouts[b], _take(pool, key, k, live, ceiling, layouts)))
        free = tuple(b for b in dying.get(k, ()) if b not in outputs and b not in inputs)
        for b in free:
            key = _nbytes(layouts[b])
            if key is not None and b not in aliased:
                pool.setdefault(key, []).append((b, k))
        steps.append(Step(tuple(allocs), w, free))
    return steps


def _live_bytes(used: Sequence[Sequence[str]], layouts: dict[str, Layout], last_use: dict[str, int],
                uncounted: set[str], outputs: set[str]) -> list[int]:
    """Bytes of the program's own buffers (all but ``uncounted``) alive in each step when every buffer is
    allocated by its first writer and freed after its last use, outputs kept to the end (no storage
    handed on); empty where a size is symbolic."""
    change = [0] * (len(used) + 1)
    seen = set(uncounted)
    for k, names in enumerate(used):
        for b in names:
            if b in seen or b not in layouts:
                continue
            seen.add(b)
            try:
                n = layout_bytes(layouts[b])
            except TypeError:  # a symbolic size: the plan cannot compare peaks
                return []
            change[k] += n
            change[len(used) if b in outputs else last_use.get(b, k) + 1] -= n
    return list(itertools.accumulate(change[:-1]))


def _take(pool: dict[object, list[tuple[str, int]]], key: object, k: int, live: list[int], ceiling: int,
          layouts: dict[str, Layout]) -> str | None:
    """A dead buffer of the same size for the allocation in step ``k``, if holding it from its death until
    then keeps every step in between under the program's unavoidable peak (``ceiling``): a stage-1
    im2col buffer handed to a stage-2 activation would otherwise sit through stage 1's larger peak.
    The most recently dead is tried (the shortest hold); if it does not fit, no older one does, now or
    later (their holds span its, and ``live`` only grows). ``live`` then counts the hold."""
    dead = pool.get(key) if key is not None else None
    if not dead:
        return None
    b, died = dead.pop()
    if not live:  # symbolic sizes: every dead buffer of the same size is taken, as before
        return b
    n = layout_bytes(layouts[b])
    if k - died > 1 and max(live[died + 1:k]) + n > ceiling:
        dead.clear()
        return None
    live[died + 1:k] = [x + n for x in live[died + 1:k]]
    return b


@dataclass(frozen=True, slots=True)
class PlannedPeak:
    """The most bytes a compiled program holds at once, walking its steps as the wrapper runs them."""

    inputs: int  # bytes of the graph's inputs
    peak: int  # most bytes of the program's own buffers (kernel and extern outputs) live at once
    peak_with_inputs: int  # most bytes live at once, inputs included (owned inputs die at last use)
    at_peak: tuple[tuple[int, str, str], ...]  # (bytes, buffer, what wrote it), largest first


def layout_bytes(layout: Layout) -> int:
    """Storage bytes of a layout: the extent its strides reach (plus its offset), times the item size."""
    shape = [int(s) for s in layout.shape]
    if any(s == 0 for s in shape):
        return 0
    extent = 1 + sum((s - 1) * int(st) for s, st in zip(shape, layout.stride))
    return (extent + int(layout.offset or 0)) * torch.empty((), dtype=layout.dtype).element_size()


def planned_peak(s: ScheduledProgram, owned_inputs: bool = False,
                 shared_inputs: frozenset[str] = frozenset()) -> PlannedPeak:
    """Walk ``s.steps`` as the generated wrapper does: an allocation that takes a dead buffer costs
    nothing, a freed buffer promised to a later allocation stays alive until then, an extern's
    outputs are new memory. ``owned_inputs``: the caller handed its inputs over (``call_owned``), so
    each dies after its last use. ``shared_inputs`` are counted elsewhere (a backward's saved
    parameters: the module holds them). Not counted: temporaries inside extern calls, ``_restride`` copies."""
    p = s.program
    assert isinstance(p, LoopProgram)
    layouts = p.layouts()
    input_bytes = {b.name: 0 if b.name in shared_inputs else layout_bytes(layouts[b.name])
                   for b in p.inputs if b.name in layouts}
    outputs = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    reused = {a.reuse for st in s.steps for a in st.allocate if a.reuse}
    last_input_use: dict[str, int] = {}
    for k, st in enumerate(s.steps):
        for b in work_buffers(st.work):
            if b in input_bytes:
                last_input_use[b] = k
    live_inputs = sum(input_bytes.values())
    if owned_inputs:  # never read: dropped right after unpacking
        live_inputs -= sum(n for b, n in input_bytes.items() if b not in last_input_use and b not in outputs)
    live: dict[str, tuple[int, str]] = {}
    peak = peak_all = 0
    at_peak: list[tuple[int, str, str]] = []
    for k, st in enumerate(s.steps):
        work = st.work
        for a in st.allocate:
            if a.reuse and a.reuse in live:
                live[a.buffer] = live.pop(a.reuse)
            elif not a.reuse:
                live[a.buffer] = (layout_bytes(a.layout), work.name)
        if isinstance(work, ExternKernel):
            for o in work.outputs:
                if o.buffer not in live and o.buffer not in input_bytes:
                    live[o.buffer] = (layout_bytes(o.layout), f"{work.kind} {work.target}")
        now = sum(n for n, _ in live.values())
        if now > peak:
            peak = now
            at_peak = sorted(((n, b, w) for b, (n, w) in live.items()), reverse=True)
        peak_all = max(peak_all, now + live_inputs)
        for b in st.free:
            if b not in reused:
                live.pop(b, None)
        if owned_inputs:
            live_inputs -= sum(input_bytes[b] for b, last in last_input_use.items()
                               if last == k and b not in outputs and b not in reused)
    return PlannedPeak(sum(input_bytes.values()), peak, peak_all, tuple(at_peak))


