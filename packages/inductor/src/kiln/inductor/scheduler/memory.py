"""Memory planning: allocate each stored buffer just before its first writer, free it after its last
reader, and hand a dead buffer's storage to a new buffer of the same size and dtype."""

from __future__ import annotations

from ..ir import (
    Allocation,
    ExternKernel,
    Kernel,
    Layout,
    LoopProgram,
    Step,
    TensorRef,
    args_buffers,
    product,
)


def _nbytes(layout: Layout) -> object:
    if not layout.is_contiguous:
        return None  # non-contiguous layouts are not reused (storage extent differs from numel)
    return (layout.dtype, product(layout.shape))


def plan_memory(p: LoopProgram, works: list[Kernel | ExternKernel]) -> list[Step]:
    layouts = p.layouts()
    outputs = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    inputs = {b.name for b in p.inputs} | ({p.seed_buffer} if p.seed_buffer else set())
    last_use: dict[str, int] = {}
    for k, w in enumerate(works):
        used = (list(w.inputs) + list(w.outputs)) if isinstance(w, Kernel) else (
            args_buffers(w.args) + args_buffers(tuple(v for _, v in w.kwargs)) + [o.buffer for o in w.outputs])
        for b in used:
            last_use[b] = k
    pool: dict[object, list[str]] = {}
    steps: list[Step] = []
    for k, w in enumerate(works):
        allocs: list[Allocation] = []
        if isinstance(w, Kernel):
            for b in w.outputs:
                key = _nbytes(layouts[b])
                reuse = pool.get(key, []).pop() if key is not None and pool.get(key) else None
                allocs.append(Allocation(b, layouts[b], reuse))
        free = tuple(b for b, last in last_use.items()
                     if last == k and b not in outputs and b not in inputs)
        for b in free:
            key = _nbytes(layouts[b])
            if key is not None:
                pool.setdefault(key, []).append(b)
        steps.append(Step(tuple(allocs), w, free))
    return steps
