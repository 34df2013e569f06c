"""Horizontal fusion of independent pointwise kernels into one launch (C++ and Triton backends).

An optimizer step written as a Python loop over a model's parameters (``p.addcdiv_(m, denom)`` per
tensor) schedules one pointwise kernel per parameter: hundreds of launches, each entering its own
OpenMP parallel region, or none at all when the tensor is below the parallel threshold (so half of
the work ran on one thread). torch.compile's C++ backend emits one function with one parallel region
and an ``omp for`` (a barrier) per tensor.

Here consecutive kernel steps become one ``KernelGroup`` step when they are independent: the backend
runs every part over one flattened index range (the parts' element counts end to end), split across
threads in blocks, with no barrier between parts (codegen/cpp/group.py). A run of kernels joins a
group while

- each is a pointwise kernel (no row loop, scan or scatter);
- no member reads or writes storage an earlier member writes, nor writes storage an earlier member
  reads. Storage is compared up to aliasing: a buffer placed over a dead one (``Allocation.reuse``)
  and the outputs of an ATen call that may return a view of its arguments count as their memory;
- the launch stays below ``MAX_PARAMS`` pointer and size arguments (ctypes takes at most 1024).

The group's allocations move to its start and its frees to its end (the parts run at once); members
are small, so the memory plan grows by little. The parts keep their own kernels: ``kernels()`` still
lists every loop nest.

Triton (codegen/triton/group.py) launches a group as one kernel whose programs are split between the
parts, each part keeping its own block size: a decode step's key-cache write, value-cache write and
query rotation were three launches of a few microseconds each per layer. There a part may also be a
scatter written in place (one launch over its source space), and ``max_params`` is lower: a kernel's
argument list is its compile cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import (
    ExternKernel,
    Kernel,
    KernelGroup,
    ScheduledProgram,
    Step,
    args_buffers,
    kernel_size_symbols,
)
from .arena import returns_alias

# pointers + sizes of one group's launch: below ctypes' 1024 arguments. Every split costs a parallel region,
# whose fork and join wait for the slowest thread: an Adam step over 200 tensors (800 pointers) ran as 4 groups
# at 256 and as one at 1000, 2.3x faster in one process on the loaded 2-core machine (wall and CPU time alike)
MAX_PARAMS = 1000


class _Aliases:
    """Union-find over buffer names: buffers sharing storage at some point of the program."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, b: str) -> str:
        root = b
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while b != root:
            self.parent[b], b = root, self.parent.get(b, b)
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _aliases(s: ScheduledProgram) -> _Aliases:
    al = _Aliases()
    for st in s.steps:
        for a in st.allocate:
            if a.reuse:
                al.union(a.buffer, a.reuse)
        w = st.work
        if isinstance(w, ExternKernel) and returns_alias(w.target):
            args = args_buffers(w.args) + args_buffers(tuple(v for _, v in w.kwargs))
            for o in w.outputs:
                for b in args:
                    al.union(o.buffer, b)
    return al


def groupable(k: object) -> bool:
    """A pointwise kernel: one flat loop nest the group can cut anywhere."""
    return isinstance(k, Kernel) and not k.inner and all(kn.kind == "pointwise" for kn in k.nodes)


def is_inplace_scatter(k: Kernel) -> bool:
    """A scatter with no initial copy (written over its base: scheduler/inplace.py): one flat launch over
    its source space."""
    return bool(k.nodes) and all(kn.kind == "scatter" for kn in k.nodes)


def _params(k: Kernel) -> set[str]:
    over = {i for _, i in k.inplace}
    return {b for b in k.inputs if b not in over} | set(k.outputs) | set(kernel_size_symbols(k))


@dataclass
class _Run:
    steps: list[Step] = field(default_factory=list)
    reads: set[str] = field(default_factory=set)  # storage roots the members read
    writes: set[str] = field(default_factory=set)  # ... and write
    params: set[str] = field(default_factory=set)

    def admits(self, k: Kernel, al: _Aliases, max_params: int) -> bool:
        r = {al.find(b) for b in k.inputs}
        w = {al.find(b) for b in k.outputs}
        return (not (r & self.writes) and not (w & self.writes) and not (w & self.reads)
                and len(self.params | _params(k)) <= max_params)

    def add(self, st: Step, k: Kernel, al: _Aliases) -> None:
        self.steps.append(st)
        self.reads |= {al.find(b) for b in k.inputs}
        self.writes |= {al.find(b) for b in k.outputs}
        self.params |= _params(k)


def _merged(run: _Run, index: int) -> Step:
    parts = tuple(st.work for st in run.steps)
    assert all(isinstance(k, Kernel) for k in parts)
    allocate = tuple(a for st in run.steps for a in st.allocate)
    free = tuple(dict.fromkeys(b for st in run.steps for b in st.free))
    return Step(allocate, KernelGroup(f"group{index}", parts), free)  # type: ignore[arg-type]


def group_kernels(s: ScheduledProgram, can_group: Callable[[object], bool] = groupable,
                  max_params: int = MAX_PARAMS) -> ScheduledProgram:
    """``s`` with every run of two or more independent consecutive kernels that ``can_group`` admits
    launched as one ``KernelGroup`` (see the module doc)."""
    al = _aliases(s)
    out: list[Step] = []
    run = _Run()
    groups = 0

    def flush() -> None:
        nonlocal run, groups
        if len(run.steps) >= 2:
            out.append(_merged(run, groups))
            groups += 1
        else:
            out.extend(run.steps)
        run = _Run()

    for st in s.steps:
        k = st.work
        if not can_group(k):
            flush()
            out.append(st)
            continue
        assert isinstance(k, Kernel)
        if not run.admits(k, al, max_params):
            flush()
        run.add(st, k, al)
    flush()
    return ScheduledProgram(s.program, tuple(out)) if groups else s
