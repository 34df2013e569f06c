"""Symbolic sizes: torch's SymInts (one ShapeEnv per graph) as kiln's sympy size symbols.

A dynamic dimension is a sympy symbol (``s0``, or whatever name the ShapeEnv gave it) in every layout,
loop range and index of the IR. Size symbols are integer and non-negative (a size may be 0 at run
time: torch's own symbols are ``positive``, which would let sympy fold ``Max(1, s0)`` to ``s0``).
The loop variables ``i*``, ``r*``, ``x*``, ``d*`` are never size symbols (``is_size_symbol``).

A float argument that varies between calls (a learning rate; kiln.capture's ``zf0``, ``zf1``...) is a
symbol too: a float symbol (``is_float_symbol``), real-valued and never a size. It appears only as
a float64 value in loop bodies (``IndexValue(zf0, float64)``: ir/scalars.py) and is passed to
kernels as a double argument beside the int64 sizes (``size_param_ctype``), so one binary serves
every value.

``SizeSource`` says where the generated wrapper reads a symbol at call time (an input tensor's size or
stride, or a symbolic int input); ``SizeGuard`` is a relation a size-dependent choice assumed, which
the wrapper checks on every call (kiln.runtime.GuardError) and the caller may check before (``CompiledGraph.size_guards``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy
import torch


@dataclass(frozen=True, slots=True)
class SizeSource:
    symbol: str  # the size symbol's name
    source: str  # a Python expression over the wrapper's inputs (``arg0.size(1)``, ``arg3``)
    hint: int  # its value in the example inputs (heuristics only; never assumed)


@dataclass(frozen=True, slots=True)
class SizeGuard:
    expr: str  # a Python boolean expression over size symbols (``s0 <= 4096``)
    reason: str  # the choice that assumed it


_KERNEL_PREFIXES = ("i", "r", "x", "d")


_FLOAT_PREFIX = "zf"  # torch's ShapeEnv names float symbols zf0, zf1... ("zuf": unbacked, never lowered)


def is_float_symbol(name: str) -> bool:
    """A float argument's symbol (a double kernel parameter), not a size."""
    return name.startswith(_FLOAT_PREFIX)


@functools.cache
def float_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, real=True)


def size_param_ctype(name: str) -> str:
    """The C type of a kernel's size parameter ``name``: int64_t, or double for a float argument."""
    return "double" if is_float_symbol(name) else "int64_t"


def is_size_symbol(s: sympy.Symbol) -> bool:
    return not (s.name[:1] in _KERNEL_PREFIXES and s.name[1:].isdigit())


def size_symbols_of(e: object) -> set[sympy.Symbol]:
    if not isinstance(e, sympy.Basic):
        return set()
    return {s for s in e.free_symbols if isinstance(s, sympy.Symbol) and is_size_symbol(s)}


def hint_of(v: object) -> dict[str, int]:
    """Every backed symbol's value in the example inputs (the ShapeEnv's hints), by name."""
    if not isinstance(v, torch.SymInt):
        return {}
    env = getattr(v.node, "shape_env", None)
    table = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", None) or {}
    return {str(k): int(x) for k, x in table.items() if isinstance(x, sympy.Integer)}


def substitute_hints(e: sympy.Expr, hints: dict[str, int]) -> sympy.Expr:
    """``e`` at the example inputs' sizes (for heuristics that want a number)."""
    if not isinstance(e, sympy.Basic):
        return e
    binds = {s: hints[s.name] for s in size_symbols_of(e) if s.name in hints}
    return e.xreplace(binds) if binds else e
