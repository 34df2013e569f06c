"""The scheduler's output and the one input of every code generator backend (C++ and Triton).

A ``Kernel`` is a loop nest over ``outer`` (kernel variables ``x0..``) and, for row kernels,
``inner`` (``r0..``) iterated once per outer point, possibly several times in sequence (stages).
A scatter kernel has two nodes: kind "pointwise" role "outer" (the initial copy, over x*) and kind
"scatter" (body and store_index over r*, run sequentially so later writes win / adds accumulate).
Each ``KernelNode`` is one fused ComputedBuffer with its body renamed to kernel variables:

- role "full": one value per (x, r) point (pointwise nodes over outer+inner, and the bodies of
  reductions: a reduction node is role "outer" but its body is evaluated at full points);
- role "outer": one value per x point (reduction results, epilogues over the outer space).

``stage`` numbers the inner loops of a row kernel: a node in stage k may use reduction results of
stages < k. A node's value is written to memory when ``store`` is set (it is read outside the kernel
or by a later stage); otherwise backends keep it in a register/local. Loads of a buffer produced in
the same kernel at its store index are reads of that local.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from .expr import Expr, IndexValue, Load, Op, format_expr, walk
from .index import IndexExpr, index_str
from .nodes import ExternKernel, Layout, args_buffers, dims_str
from .program import LoopProgram
from .sizes import size_symbols_of

ROLES = ("full", "outer")


@dataclass(frozen=True, slots=True)
class KernelNode:
    buffer: str
    role: str
    kind: str  # "pointwise" | "reduction" | "scan"
    body: Expr  # over x* (and r* for full-point bodies, reductions included)
    store_index: IndexExpr  # over x* (role outer) or x*, r* (role full)
    dtype: torch.dtype
    stage: int
    store: bool
    reduction_type: str = ""  # for kind "reduction" / "scan"; "store" | "add" for kind "scatter"
    store_indirect: tuple[Expr, ...] = ()  # kind "scatter": int64 bodies bound to d0.. in store_index

    def as_text(self) -> str:
        kind = self.kind if not self.reduction_type else f"{self.kind}_{self.reduction_type}"
        mem = f" -> [{index_str(self.store_index)}]" if self.store else " (local)"
        return f"  s{self.stage} {self.role:<5} {self.buffer} = {kind} {format_expr(self.body)}{mem}"


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    outer: tuple[IndexExpr, ...]
    inner: tuple[IndexExpr, ...]  # empty for pointwise kernels
    nodes: tuple[KernelNode, ...]
    inputs: tuple[str, ...]  # buffers read from memory
    outputs: tuple[str, ...]  # buffers written to memory
    # (output, input) pairs: the output is written over the input's memory (an optimizer's in-place
    # update, scheduler/inplace.py); every read of that input in this kernel is at the output's index
    inplace: tuple[tuple[str, str], ...] = ()

    @property
    def is_row_kernel(self) -> bool:
        return bool(self.inner)

    def as_text(self) -> str:
        head = (f"kernel {self.name}[{dims_str(self.outer)}"
                + (f" | {dims_str(self.inner)}" if self.inner else "") + "]"
                + f" reads ({', '.join(self.inputs)}) writes ({', '.join(self.outputs)})"
                + "".join(f" {o} over {i}" for o, i in self.inplace))
        return "\n".join([head, *(n.as_text() for n in self.nodes)])


@dataclass(frozen=True, slots=True)
class KernelGroup:
    """Independent pointwise kernels launched as one (horizontal fusion, scheduler/horizontal.py): the
    backend runs their loop nests over one flattened index range (the parts' element counts laid end to
    end) split across threads, so many small tensors (an optimizer step over a model's parameters) share
    one launch and one parallel region. No part reads or writes memory another part writes."""

    name: str
    parts: tuple[Kernel, ...]

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b for k in self.parts for b in k.inputs))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b for k in self.parts for b in k.outputs))

    @property
    def inplace(self) -> tuple[tuple[str, str], ...]:
        return tuple(pair for k in self.parts for pair in k.inplace)

    def as_text(self) -> str:
        head = f"group {self.name} of {len(self.parts)} kernels (one launch, one flattened range)"
        return "\n".join([head, *("  " + line for k in self.parts for line in k.as_text().splitlines())])


@dataclass(frozen=True, slots=True)
class Allocation:
    buffer: str
    layout: Layout
    reuse: str | None = None  # a dead buffer of identical size/dtype whose storage this one takes


def work_buffers(w: Kernel | KernelGroup | ExternKernel) -> list[str]:
    """The buffers a step's work names: a kernel's inputs and outputs, an extern call's tensor arguments
    and the buffers it holds (its outputs are new memory, not listed)."""
    if isinstance(w, (Kernel, KernelGroup)):
        return list(w.inputs) + list(w.outputs)
    return args_buffers(w.args) + args_buffers(tuple(v for _, v in w.kwargs)) + list(w.holds)


@dataclass(frozen=True, slots=True)
class Step:
    """One wrapper step: allocate, run a kernel or extern call, then free buffers no longer needed."""

    allocate: tuple[Allocation, ...]
    work: Kernel | KernelGroup | ExternKernel
    free: tuple[str, ...]

    def as_text(self) -> str:
        lines = [f"alloc {a.buffer}: {a.layout.as_text()}" + (f" (reuses {a.reuse})" if a.reuse else "")
                 for a in self.allocate]
        lines.append(self.work.as_text())
        if self.free:
            lines.append(f"free {', '.join(self.free)}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ScheduledProgram:
    """A LoopProgram after scheduling: the ordered steps the wrapper runs."""

    program: LoopProgram
    steps: tuple[Step, ...]

    def kernels(self) -> list[Kernel]:
        """Every loop nest, the parts of a KernelGroup included."""
        out: list[Kernel] = []
        for s in self.steps:
            if isinstance(s.work, Kernel):
                out.append(s.work)
            elif isinstance(s.work, KernelGroup):
                out.extend(s.work.parts)
        return out

    def launched(self) -> list[Kernel | KernelGroup]:
        """What the wrapper launches, one per kernel step (a KernelGroup is one launch)."""
        return [s.work for s in self.steps if isinstance(s.work, (Kernel, KernelGroup))]

    def as_text(self) -> str:
        return "\n".join(s.as_text() for s in self.steps)


def checks_indices(k: Kernel | KernelGroup) -> bool:
    """Whether the kernel checks loaded indices against their dims (``check_index``): its caller raises
    eager's IndexError when one was out of range."""
    if isinstance(k, KernelGroup):
        return any(checks_indices(part) for part in k.parts)
    return any(isinstance(x, Op) and x.name in ("check_index", "check_index_nonneg")
               for n in k.nodes for r in (n.body, *n.store_indirect) for x in walk(r))


def kernel_size_symbols(k: Kernel | KernelGroup) -> list[str]:
    """The size symbols a kernel's ranges and indices use: its size parameters, in a stable order."""
    if isinstance(k, KernelGroup):
        names = {s for part in k.parts for s in kernel_size_symbols(part)}
        return sorted(names, key=lambda s: (len(s), s))
    syms: set[str] = set()
    for e in (*k.outer, *k.inner):
        syms |= {s.name for s in size_symbols_of(sympy.sympify(e))}
    for n in k.nodes:
        loads = [x.index for r in (n.body, *n.store_indirect) for x in walk(r) if isinstance(x, (Load, IndexValue))]
        for e in [n.store_index, *loads]:
            syms |= {s.name for s in size_symbols_of(e)}
    return sorted(syms, key=lambda s: (len(s), s))
