"""Verifiers for the loop IR (LoopProgram) and the scheduled form (kernels); KILN_VERIFY runs them."""

from __future__ import annotations

from collections.abc import Mapping

import sympy
import torch

from kiln.graph import VerificationError

from .expr import OPS, Cast, Constant, Expr, IndexValue, Load, Op, walk
from .kernel import Kernel, KernelGroup, ScheduledProgram
from .nodes import (
    REDUCTION_TYPES,
    ComputedBuffer,
    ExternKernel,
    Pointwise,
    Reduction,
    Scan,
    Scatter,
    TensorRef,
)
from .program import LoopProgram, node_reads
from .sizes import is_float_symbol


def _allowed(sym: sympy.Symbol, prefixes: tuple[str, ...]) -> bool:
    name = sym.name
    return name.startswith("s") or any(name.startswith(p) and name[len(p):].isdigit() for p in prefixes)


def _float_argument(n: IndexValue) -> bool:
    """A float argument's value (ir/sizes.py): a float64 IndexValue of exactly its float symbol; a float
    symbol anywhere else in an index is an error."""
    return n.dtype == torch.float64 and isinstance(n.index, sympy.Symbol) and is_float_symbol(n.index.name)


def verify_expr(e: Expr, where: str, prefixes: tuple[str, ...], dtypes: dict[str, object]) -> None:
    for n in walk(e):
        if isinstance(n, Op):
            info = OPS.get(n.name)
            if info is None:
                raise VerificationError(f"{where}: unknown op {n.name!r}")
            if len(n.args) != info.arity:
                raise VerificationError(f"{where}: {n.name} takes {info.arity} operands, got {len(n.args)}")
        elif isinstance(n, IndexValue) and _float_argument(n):
            continue
        elif isinstance(n, (Load, IndexValue)):
            bad = [s for s in n.index.free_symbols if not _allowed(s, prefixes)]  # type: ignore[arg-type]
            if bad:
                raise VerificationError(f"{where}: index {n.index} uses {bad}, allowed loop vars {prefixes}")
            if isinstance(n, Load):
                if n.buffer not in dtypes:
                    raise VerificationError(f"{where}: loads {n.buffer!r} before it is defined")
                if dtypes[n.buffer] != n.dtype:
                    raise VerificationError(f"{where}: loads {n.buffer} as {n.dtype}, it holds {dtypes[n.buffer]}")
        elif not isinstance(n, (Constant, Cast)):
            raise VerificationError(f"{where}: {type(n).__name__} is not a loop IR expression")


def verify_program(p: LoopProgram) -> None:
    dtypes: dict[str, object] = {b.name: b.layout.dtype for b in p.inputs}
    if p.seed_buffer:
        import torch
        dtypes[p.seed_buffer] = torch.int64
    for n in p.nodes:
        if isinstance(n, ComputedBuffer):
            d = n.data
            where = f"{n.name}"
            if isinstance(d, Scatter):
                verify_expr(d.base, where, ("i", "d"), dtypes)
                for e in (d.value, *d.indirect):
                    verify_expr(e, where, ("r", "d"), dtypes)
                if d.mode not in ("store", "add"):
                    raise VerificationError(f"{where}: unknown scatter mode {d.mode!r}")
            elif isinstance(d, Reduction):
                if d.reduction_type not in REDUCTION_TYPES:
                    raise VerificationError(f"{where}: unknown reduction {d.reduction_type!r}")
                verify_expr(d.body, where, ("i", "r", "d"), dtypes)
            else:
                verify_expr(d.body, where, ("i", "d"), dtypes)
            if isinstance(d, (Pointwise, Scan, Reduction, Scatter)) and tuple(d.ranges) != tuple(n.layout.shape):
                raise VerificationError(f"{where}: ranges {d.ranges} differ from its shape {n.layout.shape}")
            if n.name in dtypes:
                raise VerificationError(f"{where}: buffer defined twice")
            dtypes[n.name] = n.layout.dtype
        else:
            assert isinstance(n, ExternKernel)
            for b in node_reads(n):
                if b not in dtypes:
                    raise VerificationError(f"{n.name}: {n.target} reads {b!r} before it is defined")
            for o in n.outputs:
                dtypes[o.buffer] = o.layout.dtype
    for ref in p.outputs:
        if isinstance(ref, TensorRef) and ref.buffer not in dtypes:
            raise VerificationError(f"output refers to undefined buffer {ref.buffer!r}")


def verify_kernel(k: Kernel, dtypes: Mapping[str, object]) -> None:
    local = dict(dtypes)
    for kn in k.nodes:
        prefixes = ("x", "r", "d") if (kn.role == "full" or kn.kind != "pointwise") else ("x", "d")
        verify_expr(kn.body, f"{k.name}/{kn.buffer}", prefixes, local)
        local[kn.buffer] = kn.dtype
        if kn.kind == "reduction" and kn.role != "outer":
            raise VerificationError(f"{k.name}/{kn.buffer}: a reduction result is per outer point")
        if kn.role == "full" and not k.inner and kn.kind != "pointwise":
            raise VerificationError(f"{k.name}/{kn.buffer}: full-role {kn.kind} outside a row kernel")


def verify_group(g: KernelGroup, dtypes: Mapping[str, object]) -> None:
    """Each part is a valid pointwise kernel (or, for Triton, a scatter written in place: one flat launch
    over its source space), and no part touches what another part writes."""
    if len(g.parts) < 2:
        raise VerificationError(f"{g.name}: a kernel group has at least two parts")
    written: dict[str, str] = {}
    for k in g.parts:
        verify_kernel(k, dtypes)
        flat = not k.inner and all(kn.kind == "pointwise" for kn in k.nodes)
        if not flat and not all(kn.kind == "scatter" for kn in k.nodes):
            raise VerificationError(f"{g.name}/{k.name}: only pointwise kernels and in-place scatters are grouped")
        for b in k.outputs:
            written[b] = k.name
    for k in g.parts:
        for b in (*k.inputs, *k.outputs):
            if written.get(b, k.name) != k.name:
                raise VerificationError(f"{g.name}: {k.name} uses {b}, which {written[b]} writes")


def verify_schedule(s: ScheduledProgram) -> None:
    p = s.program
    assert isinstance(p, LoopProgram)
    verify_program(p)
    dtypes = {name: lay.dtype for name, lay in p.layouts().items()}
    if p.seed_buffer:
        import torch
        dtypes[p.seed_buffer] = torch.int64
    for step in s.steps:
        if isinstance(step.work, Kernel):
            verify_kernel(step.work, dtypes)
        elif isinstance(step.work, KernelGroup):
            verify_group(step.work, dtypes)
