"""Symbolic sizes: torch's SymInts (one ShapeEnv per graph) as kiln's sympy size symbols.

A dynamic dimension is a sympy symbol (``s0``, or whatever name the ShapeEnv gave it) in every layout,
loop range and index of the IR. Size symbols are integer and non-negative (a size may be 0 at run
time: torch's own symbols are ``positive``, which would let sympy fold ``Max(1, s0)`` to ``s0``).
The loop variables ``i*``, ``r*``, ``x*``, ``d*`` are never size symbols (``is_size_symbol``).

``SizeSource`` says where the generated wrapper reads a symbol at call time (an input tensor's size or
stride, or a symbolic int input); ``SizeGuard`` is a relation a size-dependent choice assumed, which
the wrapper checks on every call (kiln.runtime.GuardError) and the caller may check before (``CompiledGraph.size_guards``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from .expr import IndexValue, Load, walk
from .kernel import Kernel


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


def kernel_size_symbols(k: Kernel) -> list[str]:
    """The size symbols a kernel's ranges and indices use: its size parameters, in a stable order."""
    syms: set[str] = set()
    for e in (*k.outer, *k.inner):
        syms |= {s.name for s in size_symbols_of(sympy.sympify(e))}
    for n in k.nodes:
        loads = [x.index for r in (n.body, *n.store_indirect) for x in walk(r) if isinstance(x, (Load, IndexValue))]
        for e in [n.store_index, *loads]:
            syms |= {s.name for s in size_symbols_of(e)}
    return sorted(syms, key=lambda s: (len(s), s))
