"""Where the wrapper finds each size symbol at call time, collected while the inputs are lowered."""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from ..ir import (
    ComputedBuffer,
    ConstArg,
    DerivedSize,
    DynamicShapeUnsupported,
    ExternKernel,
    Layout,
    ListArg,
    LoopProgram,
    SizeSource,
    SymScalar,
    TensorRef,
    loop_bodies,
    size_symbols_of,
    sym_expr,
    sym_scalar,
    walk,
)
from ..ir.expr import IndexValue, Load
from ..ir.sizes import hint_of


class SizeTable:
    """Size symbols of a graph's inputs: the first input size, stride or symbolic int that is exactly
    a symbol is where the wrapper reads it (``arg0.size(1)``)."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.hints: dict[str, int] = {}
        self.scalars: list[int] = []

    def _note(self, v: object, source: str) -> sympy.Expr:
        e = sym_expr(v)
        if isinstance(v, torch.SymInt):
            self.hints.update(hint_of(v))
            # the symbol as the input had it before any replacement: a guard may name it (s9 == 3)
            raw = getattr(v.node, "_expr", None)
            if isinstance(raw, sympy.Symbol) and raw.name not in self.sources:
                self.sources[raw.name] = source
        if isinstance(e, sympy.Symbol) and e.name not in self.sources:
            self.sources[e.name] = source
        return e

    def scalar(self, v: torch.SymInt, position: int) -> sympy.Expr:
        self.scalars.append(position)
        return self._note(v, f"arg{position}")

    def float_scalar(self, v: torch.SymFloat, position: int) -> SymScalar:
        """A float argument that varies (its float symbol): a float64 value the kernels take as a double."""
        self.scalars.append(position)
        value = sym_scalar(v)
        if not (isinstance(value.value, IndexValue) and isinstance(value.value.index, sympy.Symbol)):
            raise DynamicShapeUnsupported(f"float input {v.node.expr} is not a float symbol of its own")
        self.sources.setdefault(value.value.index.name, f"arg{position}")
        return value

    def tensor(self, val: torch.Tensor, name: str) -> Layout:
        shape = tuple(self._note(s, f"{name}.size({d})") for d, s in enumerate(val.shape))
        stride = tuple(self._note(s, f"{name}.stride({d})") for d, s in enumerate(val.stride()))
        # the lowering addresses inputs from their own data pointer (the wrapper passes the tensor)
        return Layout(shape, stride, val.dtype, val.device.type)

    def finish(self, p: LoopProgram) -> LoopProgram:
        """The program with its size sources; every size symbol it uses must have one. Derived sizes
        (``floor(1.5 * s0)``: ir/index.py's DerivedSize) are computed after the sizes they read."""
        used = _used_symbols(p)
        derived = sorted((s for s in used if isinstance(s, DerivedSize)), key=lambda s: s.name)
        needed = {s.name for s in used if not isinstance(s, DerivedSize)} | {d for s in derived for d in s.depends}
        missing = sorted(s for s in needed if s not in self.sources)
        if missing:
            raise DynamicShapeUnsupported(
                f"size symbol(s) {', '.join(missing)} appear in the graph but no input has one of them as a "
                "whole size, stride or int argument (kiln.inductor reads every symbol from the inputs)")
        sizes = [SizeSource(sym, src, self.hints.get(sym, 8)) for sym, src in self.sources.items()]
        hints = {z.symbol: z.hint for z in sizes}
        sizes += [SizeSource(s.name, s.source, _derived_hint(s, hints)) for s in derived]
        return dataclasses.replace(p, sizes=tuple(sizes), scalar_inputs=tuple(self.scalars))


def _derived_hint(s: DerivedSize, hints: dict[str, int]) -> int:
    """The derived size at the example inputs' sizes (heuristics only)."""
    try:
        return int(eval(s.source, {}, dict(hints)))  # noqa: S307 - an expression kiln printed
    except (ArithmeticError, NameError, ValueError):
        return 8


def _arg_exprs(args: list[Any]) -> list[object]:
    """The sizes an extern call's arguments name: views' shapes, strides and offsets, int arguments (a
    symbolic one is a sympy expression)."""
    out: list[object] = []
    for a in args:
        if isinstance(a, TensorRef):
            out += [*a.shape, *a.stride, a.offset]
        elif isinstance(a, ListArg):
            out += _arg_exprs(list(a.items))
        elif isinstance(a, ConstArg) and isinstance(a.value, sympy.Expr):
            out.append(a.value)
    return out


def _used_symbols(p: LoopProgram) -> set[sympy.Symbol]:
    exprs: list[object] = []
    for lay in p.layouts().values():
        exprs += [*lay.shape, *lay.stride, lay.offset]
    for n in p.nodes:
        if isinstance(n, ComputedBuffer):
            d = n.data
            exprs += list(getattr(d, "ranges", ())) + list(getattr(d, "reduction_ranges", ()))
            exprs += list(getattr(d, "src_ranges", ())) + [getattr(d, "index", 0)]
            for body in loop_bodies(d):
                exprs += [e.index for e in walk(body) if isinstance(e, (Load, IndexValue))]
        elif isinstance(n, ExternKernel):
            exprs += [x for o in n.outputs for x in (*o.layout.shape, *o.layout.stride)]
            exprs += _arg_exprs([*n.args, *(v for _, v in n.kwargs)])
    out: set[sympy.Symbol] = set()
    for e in exprs:
        out |= size_symbols_of(e)
    return out
