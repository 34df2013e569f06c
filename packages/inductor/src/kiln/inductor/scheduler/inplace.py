"""Input mutations written in place by the kernel that computes them.

A functional graph returns the new value of every input it mutated; kiln.autograd copies it back after
the call (``GraphAnnotations.input_mutations``: (output position, input position) pairs). For an
optimizer step written with in-place ops (``p.addcdiv_``, ``m.mul_().add_()``) that is one fresh buffer
plus one full copy per state tensor per step: the adam_update benchmark spent more time in the 150
``copy_`` calls and allocations than in its kernels. torch.compile writes into the parameters.

Here the output buffer takes the input's memory when that is safe:

- a pointwise kernel (no row loops, no scatter) computes it, with exactly the input's layout; or a row
  kernel computes it as one value per outer point that only its own node reads the input for
  (``_row_kernel_site``: a training BatchNorm's running statistics, beside its batch statistics);
- every read of the input in that kernel is at the output's store index (each loop point reads the old
  value only where it writes the new one; the C++ writer stores after all loads of a point);
- nothing after that kernel reads the input, and no graph output is the input itself or a view of it,
  nor the new value a second time (a forward's saved tensor: the input's next update would change it).

The wrapper then binds the output to the input tensor (no allocation) and the write-back finds the same
memory and copies nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import sympy

from ..ir import (
    Allocation,
    ExternKernel,
    FloorDiv,
    Kernel,
    KernelGroup,
    Layout,
    Load,
    LoopProgram,
    ModIndex,
    ScheduledProgram,
    Step,
    TensorRef,
    product,
    reads,
    work_buffers,
)
from .memory import storage_groups


def _buffers_used(w: Kernel | KernelGroup | ExternKernel) -> set[str]:
    if isinstance(w, (Kernel, KernelGroup)):
        return set(w.inputs) | set(w.outputs)
    return set(work_buffers(w)) | {o.buffer for o in w.outputs}


def _canonical(e: sympy.Expr) -> sympy.Expr:
    """``a % b`` written as ``a - b * (a // b)`` (true for the non-negative values indices take), so
    that a load through a view's div/mod (``3072 * (x0 % 197) + 605184 * (x0 // 197)``) and the
    store's flat index (``3072 * x0``) expand to the same expression."""
    return sympy.expand(e.replace(lambda t: isinstance(t, ModIndex),
                                  lambda t: t.args[0] - t.args[1] * FloorDiv(t.args[0], t.args[1])))


def _reads_only_at(k: Kernel, buffer: str, out: str) -> bool:
    """Whether every load of ``buffer`` in ``k`` is a direct load at ``out``'s store index."""
    node = next(kn for kn in k.nodes if kn.buffer == out)
    store = None
    for kn in k.nodes:
        for ld in reads(kn.body):
            if ld.buffer != buffer:
                continue
            if ld.indirect:
                return False
            if sympy.expand(ld.index - node.store_index) != 0:
                store = _canonical(node.store_index) if store is None else store
                if sympy.expand(_canonical(ld.index) - store) != 0:
                    return False
    return True


def _eligible_kernel(k: Kernel, out: str) -> bool:
    node = next((kn for kn in k.nodes if kn.buffer == out), None)
    return (node is not None and node.store and not k.inner
            and all(kn.kind == "pointwise" for kn in k.nodes))


def _row_kernel_site(k: Kernel, out: str, inp: str) -> bool:
    """A row kernel (reductions, row loops) may write ``out`` over ``inp`` when ``out`` is one value per
    outer point (a BatchNorm's running-statistic update beside the batch statistics it is computed
    from), computed by the only node that reads ``inp`` and read by no node: at every point that node
    loads the old value before it stores the new one, in whichever order the writer emits the nodes
    (where the tiled writer splits rows between threads, one thread computes it)."""
    node = next((kn for kn in k.nodes if kn.buffer == out), None)
    if node is None or node.kind != "pointwise" or node.role != "outer" or not node.store:
        return False
    return _sole_reader(k, out, inp) and not any(ld.buffer == out for kn in k.nodes for ld in reads(kn.body))


def _mutation_sites(s: ScheduledProgram, mutations: Sequence[tuple[int, int]],
                    steps: list[Step]) -> Iterator[tuple[str, str, int, Kernel]]:
    """(output, input, step, kernel) for each mutated input whose new value is a graph output that one
    kernel of ``steps`` computes in exactly the input's layout (shape, strides, offset, dtype: not the
    device field, which a kernel output's does not always carry), the input not returned itself, nothing
    after that kernel reading the input, and the kernel's allocation of the output free to take the
    input's memory. ``steps`` is the caller's list, which it may change between sites."""
    p = s.program
    assert isinstance(p, LoopProgram)
    layouts = p.layouts()
    by_position = {b.position: b.name for b in p.inputs}
    returned = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    for out_pos, in_pos in mutations:
        if out_pos >= len(p.outputs) or in_pos not in by_position:
            continue
        ref, inp = p.outputs[out_pos], by_position[in_pos]
        if not isinstance(ref, TensorRef) or inp in returned:
            continue
        out = ref.buffer
        if sum(isinstance(o, TensorRef) and o.buffer == out for o in p.outputs) != 1:
            continue  # also returned otherwise (saved for a backward): a later write of the input would change it
        lay_o, lay_i = layouts[out], layouts[inp]
        if (tuple(ref.shape), tuple(ref.stride), ref.offset) != (lay_o.shape, lay_o.stride, lay_o.offset) \
                or (lay_o.shape, lay_o.stride, lay_o.offset, lay_o.dtype) != (lay_i.shape, lay_i.stride,
                                                                          lay_i.offset, lay_i.dtype):
            continue
        k = next((j for j, st in enumerate(steps) if isinstance(st.work, Kernel) and out in st.work.outputs), None)
        if k is None or any(inp in _buffers_used(st.work) for st in steps[k + 1:]):
            continue
        if any(a.buffer == out for a in steps[k].allocate):
            work = steps[k].work
            assert isinstance(work, Kernel)
            yield out, inp, k, work


def _written_over(step: Step, work: Kernel, out: str, inp: str) -> Step:
    """``step`` running ``work`` with ``out`` allocated over ``inp``'s memory."""
    allocs = tuple(Allocation(a.buffer, a.layout, inp) if a.buffer == out else a for a in step.allocate)
    return Step(allocs, replace(work, inplace=(*work.inplace, (out, inp))), step.free)


def _sole_reader(k: Kernel, out: str, inp: str) -> bool:
    """A pointwise kernel in which only ``out``'s node reads ``inp``: each element's new value is computed from
    its old one (``_reads_only_at``), so the load precedes the store whatever order the writer emits the nodes
    in and however a Triton program spreads a tile over its threads. (Other nodes may read ``out``: fusion puts
    a reader in its producer's kernel only at the element the producer computes, so they read registers.)"""
    node = next((kn for kn in k.nodes if kn.buffer == out), None)
    readers = [kn for kn in k.nodes if any(ld.buffer == inp for ld in reads(kn.body))]
    return node is not None and readers == [node]


def plan_inplace_updates(s: ScheduledProgram, mutations: Sequence[tuple[int, int]], *,
                         sole_reader: bool = False) -> ScheduledProgram:
    """``s`` with each eligible mutated-input output written over its input (see the module doc).
    ``sole_reader`` (the Triton writer, which emits a node's store where the node is): a pointwise kernel
    qualifies only when the output's own node is the input's only reader (``_sole_reader``)."""
    steps = list(s.steps)
    taken: set[str] = set()
    for out, inp, k, work in _mutation_sites(s, mutations, steps):
        eligible = _eligible_kernel(work, out) and (not sole_reader or _sole_reader(work, out, inp)) \
            if not work.inner else _row_kernel_site(work, out, inp)
        if inp in taken or not eligible or not _reads_only_at(work, inp, out):
            continue
        steps[k] = _written_over(steps[k], work, out, inp)
        taken.add(inp)
    return ScheduledProgram(s.program, tuple(steps)) if taken else s


def plan_inplace_scatters(s: ScheduledProgram, mutations: Sequence[tuple[int, int]]) -> ScheduledProgram:
    """``s`` with each mutated input that a scatter over itself computes (an in-place ``index_put_``: a KV
    cache's new positions, lowering/indexing.py) written in place: the output takes the input's memory and
    the kernel keeps only its scatter, so the elements it does not index are neither copied nor touched.
    Both backends (the scatter reads nothing it writes: the lowering refused values or indices reading the
    input); otherwise the conditions of ``plan_inplace_updates`` (``_mutation_sites``)."""
    steps = list(s.steps)
    changed = False
    for out, inp, k, work in _mutation_sites(s, mutations, steps):
        if len(work.nodes) != 2 or work.outputs != (out,):
            continue
        init, sc = work.nodes
        base = init.body
        if sc.kind != "scatter" or init.kind != "pointwise" or not (
                isinstance(base, Load) and base.buffer == inp and not base.indirect
                and sympy.expand(base.index - init.store_index) == 0):
            continue
        if any(ld.buffer == inp for e in (sc.body, *sc.store_indirect) for ld in reads(e)):
            continue
        inputs = tuple(dict.fromkeys(ld.buffer for e in (sc.body, *sc.store_indirect) for ld in reads(e)))
        steps[k] = _written_over(steps[k], replace(work, nodes=(sc,), inputs=inputs), out, inp)
        changed = True
    return ScheduledProgram(s.program, tuple(steps)) if changed else s


def _same_memory_layout(a: Layout, b: Layout) -> bool:
    """Same shape, strides, offset and dtype, or both contiguous over as many elements of one dtype
    (a matmul's [B*L, C] output and the [B, L, C] activation computed from it: lowering stores an
    extern's reshaped operand in its source's shape). Kernel outputs' ``device`` field is not always
    the program's: one program runs on one device."""
    if (a.shape, a.stride, a.offset, a.dtype) == (b.shape, b.stride, b.offset, b.dtype):
        return True
    return (a.dtype == b.dtype and a.is_contiguous and b.is_contiguous
            and sympy.expand(product(a.shape) - product(b.shape)) == 0)


def _hand_over(steps: list[Step], inp: str, out: str, k: int, reused: set[str], keep: set[str]) -> bool:
    """``inp`` is promised to a later allocation Y (memory.py's pool) and ``out`` now takes its memory.
    Y gets ``out`` instead when ``out`` dies before Y and is promised to nobody, else fresh memory.
    Never more live memory: at every later step the same number of storages exist (Y's own or
    ``out``'s takes the place of the one ``out`` would have had), and at step ``k`` one fewer."""
    later = next(((y, j) for y in range(k + 1, len(steps)) for j, a in enumerate(steps[y].allocate)
                  if a.reuse == inp), None)
    if later is None:
        return False
    dies = next((f for f in range(k, len(steps)) if out in steps[f].free), None)
    y, j = later
    free_for_y = out not in keep and out not in reused and dies is not None and dies < y
    allocs = list(steps[y].allocate)
    allocs[j] = Allocation(allocs[j].buffer, allocs[j].layout, out if free_for_y else None)
    steps[y] = Step(tuple(allocs), steps[y].work, steps[y].free)
    if free_for_y:
        reused.add(out)
    return True


def plan_inplace_reuse(s: ScheduledProgram, single_store: bool = False) -> ScheduledProgram:
    """Intermediate buffers written over by the pointwise kernel that reads them last (C++ backend).

    Buffer reuse (memory.py) hands a dead buffer to a later allocation only after the step that
    frees it, so a pointwise kernel whose input dies in it (``grad_a + grad_b`` of a tied weight's
    two gradients, a residual add, an activation's backward) held input and output at once: one
    buffer more than eager, which adds in place or frees the input as it goes. Same conditions as
    ``plan_inplace_updates``; the input must also not be a graph input or output, nor planned for
    reuse by a later allocation (see below), and the output must have the input's memory layout. An
    output the pool gave a dead buffer takes the dying input instead: the pool's buffer is then freed
    where it died rather than held until this step.
    An input the pool promised to a later allocation is taken too; the promise passes to the output,
    or that allocation gets fresh memory (``_hand_over``).
    ``single_store`` (Triton, whose writer does not defer stores): only kernels storing that one output,
    whose store depends on every load that feeds it, so no load can follow it.
    """
    p = s.program
    assert isinstance(p, LoopProgram)
    layouts = p.layouts()
    keep = {b.name for b in p.inputs} | {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    if p.seed_buffer:
        keep.add(p.seed_buffer)
    reused = {a.reuse for st in s.steps for a in st.allocate if a.reuse}
    # a view an extern returned and the buffer it views (a wait's result and the collective's output)
    # are one storage: a kernel reading both names cannot write over either
    same_storage = {b: set(g) - {b} for g in storage_groups([st.work for st in s.steps]) for b in g}
    steps = list(s.steps)
    changed = False
    for k, st in enumerate(steps):
        work = st.work
        if not isinstance(work, Kernel) or work.inner or any(kn.kind != "pointwise" for kn in work.nodes):
            continue
        if single_store and (len(work.outputs) != 1 or sum(kn.store for kn in work.nodes) != 1):
            continue
        taken = {i for _, i in work.inplace}
        allocs = list(st.allocate)
        done = {o for o, _ in work.inplace}
        for j, a in enumerate(allocs):
            if a.buffer in done or not _eligible_kernel(work, a.buffer):
                continue
            inp = next((i for i in work.inputs if i in st.free and i not in keep and i not in taken
                        and not same_storage.get(i, set()) & set(work.inputs)
                        and _same_memory_layout(layouts[i], a.layout) and _reads_only_at(work, i, a.buffer)
                        and (i not in reused or _hand_over(steps, i, a.buffer, k, reused, keep))), None)
            if inp is None:
                continue
            if a.reuse is not None:
                # the pool's buffer is not needed after all: freed where it died (so on CUDA the caching
                # allocator can give it to an extern's output) instead of held until this step
                reused.discard(a.reuse)
            allocs[j] = Allocation(a.buffer, a.layout, inp)
            work = replace(work, inplace=(*work.inplace, (a.buffer, inp)))
            taken.add(inp)
            reused.add(inp)
        if work is not st.work:
            steps[k] = Step(tuple(allocs), work, st.free)
            changed = True
    return ScheduledProgram(p, tuple(steps)) if changed else s
