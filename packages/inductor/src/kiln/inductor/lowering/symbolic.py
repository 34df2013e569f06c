"""Where the wrapper finds each size symbol at call time, collected while the inputs are lowered."""

from __future__ import annotations

import dataclasses

import sympy
import torch

from ..ir import (
    ComputedBuffer,
    DynamicShapeUnsupported,
    ExternKernel,
    Layout,
    LoopProgram,
    SizeSource,
    loop_bodies,
    size_symbols_of,
    sym_expr,
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

    def tensor(self, val: torch.Tensor, name: str) -> Layout:
        shape = tuple(self._note(s, f"{name}.size({d})") for d, s in enumerate(val.shape))
        stride = tuple(self._note(s, f"{name}.stride({d})") for d, s in enumerate(val.stride()))
        # the lowering addresses inputs from their own data pointer (the wrapper passes the tensor)
        return Layout(shape, stride, val.dtype, val.device.type)

    def finish(self, p: LoopProgram) -> LoopProgram:
        """The program with its size sources; every size symbol it uses must have one."""
        used = _used_symbols(p)
        missing = sorted(s for s in used if s not in self.sources)
        if missing:
            raise DynamicShapeUnsupported(
                f"size symbol(s) {', '.join(missing)} appear in the graph but no input has one of them as a "
                "whole size, stride or int argument (kiln.inductor reads every symbol from the inputs)")
        sizes = tuple(SizeSource(sym, src, self.hints.get(sym, 8)) for sym, src in self.sources.items())
        return dataclasses.replace(p, sizes=sizes, scalar_inputs=tuple(self.scalars))


def _used_symbols(p: LoopProgram) -> set[str]:
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
    out: set[str] = set()
    for e in exprs:
        out |= {s.name for s in size_symbols_of(e)}
    return out
