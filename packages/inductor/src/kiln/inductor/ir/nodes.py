"""Buffers and the nodes that compute them: pointwise, reduction and scan loops, extern kernel calls.

Every node writes named buffers with a ``Layout`` (shape, strides, offset in elements, dtype, device).
Loop nodes compute one element per point of their iteration space; their store index is the output
layout applied to the loop variables ``i0..``. Reductions and scans also use ``r0..``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from .expr import Expr, format_dtype, format_expr
from .index import IndexExpr, contiguous_strides, index_vars, strided_index


@dataclass(frozen=True, slots=True)
class Layout:
    shape: tuple[IndexExpr, ...]
    stride: tuple[IndexExpr, ...]
    dtype: torch.dtype
    device: str = "cpu"
    offset: IndexExpr = sympy.S.Zero

    @staticmethod
    def contiguous(shape: tuple[IndexExpr, ...], dtype: torch.dtype, device: str = "cpu") -> Layout:
        return Layout(tuple(shape), contiguous_strides(shape), dtype, device)

    def index(self, vars_: tuple[IndexExpr, ...]) -> IndexExpr:
        return strided_index(vars_, self.stride, self.offset)

    def store_index(self) -> IndexExpr:
        return self.index(index_vars("i", len(self.shape)))

    @property
    def is_contiguous(self) -> bool:
        return self.offset == 0 and all(
            st == cs or sz == 1 for sz, st, cs in zip(self.shape, self.stride, contiguous_strides(self.shape)))

    def as_text(self) -> str:
        shape = dims_str(self.shape)
        stride = dims_str(self.stride)
        off = f" +{dim_str(self.offset)}" if self.offset != 0 else ""
        return f"{format_dtype(self.dtype)}[{shape}]({stride}){off}"


@dataclass(frozen=True, slots=True)
class InputBuffer:
    """A graph input (placeholder ``position``); its layout is the example input's."""

    name: str
    layout: Layout
    position: int


@dataclass(frozen=True, slots=True)
class Pointwise:
    ranges: tuple[IndexExpr, ...]
    body: Expr  # over i0..i{n-1}


REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


@dataclass(frozen=True, slots=True)
class Reduction:
    ranges: tuple[IndexExpr, ...]  # the output's iteration space (i*)
    reduction_ranges: tuple[IndexExpr, ...]  # the reduced space (r*)
    reduction_type: str
    body: Expr  # over i* and r*; argmax/argmin yield the flat r-index of the first extremum


@dataclass(frozen=True, slots=True)
class Scan:
    """An inclusive scan (cumsum/cumprod) along ``axis`` of ``ranges``; body over i*."""

    ranges: tuple[IndexExpr, ...]
    axis: int
    scan_type: str  # "sum" | "prod"
    body: Expr


@dataclass(frozen=True, slots=True)
class Scatter:
    """``out = base`` over ``ranges`` (i*), then for every point of ``src_ranges`` (r*, in order):
    ``out[index] = value`` (mode "store") or ``out[index] += value`` (mode "add"). ``index`` may use
    ``d0..`` bound to ``indirect`` (int64 bodies over r*), like an indirect load."""

    ranges: tuple[IndexExpr, ...]
    base: Expr
    src_ranges: tuple[IndexExpr, ...]
    index: IndexExpr
    indirect: tuple[Expr, ...]
    value: Expr
    mode: str


LoopData = Pointwise | Reduction | Scan | Scatter


def loop_bodies(d: LoopData) -> tuple[Expr, ...]:
    """Every expression a loop node evaluates (for dependency analysis and verification)."""
    if isinstance(d, Scatter):
        return (d.base, d.value, *d.indirect)
    return (d.body,)


@dataclass(frozen=True, slots=True)
class ComputedBuffer:
    name: str
    layout: Layout
    data: LoopData
    origins: tuple[str, ...] = ()  # the ATen ops it came from, for kernel names

    def as_text(self) -> str:
        d = self.data
        head = f"{self.name}: {self.layout.as_text()} = "
        if isinstance(d, Pointwise):
            return head + f"pointwise[{dims_str(d.ranges)}] {format_expr(d.body)}"
        if isinstance(d, Reduction):
            return head + (f"reduce_{d.reduction_type}[{dims_str(d.ranges)} | {dims_str(d.reduction_ranges)}] "
                           f"{format_expr(d.body)}")
        if isinstance(d, Scatter):
            binds = "".join(f", d{k}={format_expr(a)}" for k, a in enumerate(d.indirect))
            return head + (f"scatter_{d.mode}[{dims_str(d.ranges)}] {format_expr(d.base)} then "
                           f"[{dims_str(d.src_ranges)}] at [{d.index}{binds}] {format_expr(d.value)}")
        return head + f"scan_{d.scan_type}[{dims_str(d.ranges)} axis={d.axis}] {format_expr(d.body)}"


def dims_str(r: tuple[IndexExpr, ...]) -> str:
    return ", ".join([dim_str(x) for x in r])


def dim_str(x: IndexExpr) -> str:
    """``str(x)``; integers without sympy's printer (most sizes and strides are integers)."""
    return str(int(x)) if isinstance(x, (int, sympy.Integer)) else str(x)


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A strided view of a buffer, passed to extern kernels or returned as a graph output."""

    buffer: str
    shape: tuple[IndexExpr, ...]
    stride: tuple[IndexExpr, ...]
    offset: IndexExpr
    dtype: torch.dtype

    def as_text(self) -> str:
        return (f"{self.buffer}.view([{dims_str(self.shape)}], ({dims_str(self.stride)}), +{dim_str(self.offset)})")


@dataclass(frozen=True, slots=True)
class ConstArg:
    value: object  # int, float, bool, None, str, torch.dtype, torch.device, torch.memory_format

    def as_text(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, slots=True)
class ListArg:
    items: tuple[Arg, ...]

    def as_text(self) -> str:
        return "[" + ", ".join(a.as_text() for a in self.items) + "]"


Arg = TensorRef | ConstArg | ListArg


@dataclass(frozen=True, slots=True)
class ExternOutput:
    buffer: str
    layout: Layout
    path: tuple[int, ...]  # where in the op's (nested tuple) result this tensor is


@dataclass(frozen=True, slots=True)
class ExternKernel:
    """A call of an ATen op from the wrapper: an extern (library kernel) or a fallback (not lowered)."""

    name: str
    target: str  # "aten.mm.default"
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...]
    outputs: tuple[ExternOutput, ...]
    kind: str  # "extern" | "fallback"
    # buffers the call keeps in use without passing them: a ``wait_tensor`` holds its collective's
    # operands and outputs, which the communication reads and writes until the wait returns
    # (lowering/collectives.py), so liveness, reuse and in-place writes treat them as read here
    holds: tuple[str, ...] = ()

    def as_text(self) -> str:
        args = [a.as_text() for a in self.args] + [f"{k}={v.as_text()}" for k, v in self.kwargs]
        outs = ", ".join(f"{o.buffer}: {o.layout.as_text()}" for o in self.outputs)
        held = f" holding [{', '.join(self.holds)}]" if self.holds else ""
        return f"{outs} = {self.kind} {self.target}({', '.join(args)}){held}"


Node = ComputedBuffer | ExternKernel


def node_outputs(n: Node) -> tuple[str, ...]:
    if isinstance(n, ComputedBuffer):
        return (n.name,)
    return tuple(o.buffer for o in n.outputs)


def args_buffers(args: tuple[Arg, ...]) -> list[str]:
    out: list[str] = []
    for a in args:
        if isinstance(a, TensorRef):
            out.append(a.buffer)
        elif isinstance(a, ListArg):
            out.extend(args_buffers(a.items))
    return out
