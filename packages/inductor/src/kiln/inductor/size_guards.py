"""Symbolic-size bookkeeping of one compile: the ShapeEnv's guards the compile added.

Note: a compile with symbolic sizes must not make choices that hold only for the example sizes. Where
a pass still asks a SymInt for a number (``int(s)``, ``s == 3``, ``s > 4096``), torch's ShapeEnv
answers from the example and records the assumption as a guard (or a replacement ``s -> 3``).
``GuardWatch`` collects what this compile added: each becomes a ``SizeGuard`` that the generated
wrapper checks on every call (``kiln.runtime.GuardError`` when it fails) and that the compiled graph
lists in ``size_guards``, so the caller can check (or guard on) it too; each is logged in
``perf_hints``. The same ShapeEnv is the caller's: its guards already include these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.graph import log

from .codegen.triton.printer import python_index
from .ir import DynamicShapeUnsupported, SizeGuard, is_float_symbol
from .ir.index import to_kiln

_SHOWN = 4  # size guards a compile's log line spells out
_REL = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">="}


def shape_env_of(example_inputs: Sequence[Any]) -> Any:
    for x in example_inputs:
        vals = [x] if isinstance(x, (torch.SymInt, torch.SymFloat)) else (
            [*x.shape, *x.stride()] if isinstance(x, torch.Tensor) else [])
        for v in vals:
            if isinstance(v, (torch.SymInt, torch.SymFloat)):
                env = getattr(v.node, "shape_env", None)
                if env is not None:
                    return env
    return None


def guard_text(e: sympy.Basic) -> str:
    """A ShapeEnv relation as Python over kiln's size symbols."""
    return relation_source(e, lambda x: python_index(to_kiln(x)))


class GuardWatch:
    """The guards and replacements a ShapeEnv gains while this compile runs."""

    def __init__(self, example_inputs: Sequence[Any]) -> None:
        self.env = shape_env_of(example_inputs)
        self.n_guards = len(self.env.guards) if self.env is not None else 0
        self.replacements = dict(self.env.replacements) if self.env is not None else {}
        self.explained: set[str] = set()  # guards a step added with its own reason (``since``)

    @property
    def symbolic(self) -> bool:
        return self.env is not None

    def mark(self) -> int:
        return len(self.env.guards) if self.env is not None else 0

    def since(self, mark: int, reason: str) -> tuple[SizeGuard, ...]:
        """The guards added since ``mark`` by a step that says why (``reason``): they are the program's
        size guards with that reason, and ``added`` leaves them out."""
        if self.env is None:
            return ()
        out = tuple(dict.fromkeys(SizeGuard(guard_text(g.expr), reason) for g in self.env.guards[mark:]))
        self.explained.update(g.expr for g in out)
        return out

    def added(self, name: str) -> tuple[SizeGuard, ...]:
        if self.env is None:
            return ()
        out: list[SizeGuard] = []
        for sym, e in self.env.replacements.items():
            if self.replacements.get(sym) != e:
                out.append(SizeGuard(guard_text(sympy.Eq(sym, e)), "a compile step specialised this size"))
        for g in self.env.guards[self.n_guards:]:
            text = guard_text(g.expr)
            if text not in self.explained:
                out.append(SizeGuard(text, "a compile step assumed this relation"))
        out = list(dict.fromkeys(out))
        if out:  # one line per compile: channels-last convolutions over symbolic images add ~20 at once
            shown = "; ".join(f"{g.expr} ({g.reason})" for g in out[:_SHOWN])
            more = f"; and {len(out) - _SHOWN} more (CompiledGraph.size_guards)" if len(out) > _SHOWN else ""
            log("perf_hints").warning("graph %s: compiled for sizes with %s%s; the wrapper checks %s per call",
                                      name, shown, more, "it" if len(out) == 1 else "them")
        return tuple(out)


def shape_relations(example_inputs: Sequence[Any], skip_floats: bool = False) -> tuple[sympy.Basic, ...]:
    """Every relation the ShapeEnv of ``example_inputs`` holds so far, in kiln's vocabulary: the guards
    it recorded (capture's, the trace's and this compile's) and its replacements (``s2 -> s0`` as
    ``Eq(s2, s0)``). A program run without the capture's guard check (a package's C++ wrapper) checks
    them all; ``()`` for static inputs. ``skip_floats``: leave out those over a float argument
    (``Ne(zf0**2 + 1, 0)``), which the caller's guard check holds."""
    env = shape_env_of(example_inputs)
    if env is None:
        return ()
    out: dict[sympy.Basic, None] = {}
    for sym, e in env.replacements.items():
        if sym != e:
            out[_relation(sympy.Eq(sym, e, evaluate=False))] = None
    for g in env.guards:
        if skip_floats and any(is_float_symbol(str(x)) for x in g.expr.free_symbols):
            continue
        if g.expr.free_symbols:
            out[_relation(g.expr)] = None
    return tuple(out)


def _relation(e: sympy.Basic) -> sympy.Basic:
    """``e`` over kiln's size symbols (and/or/not and the six relations kept as they are)."""
    if isinstance(e, (sympy.And, sympy.Or, sympy.Not)):
        return e.func(*(_relation(a) for a in e.args), evaluate=False)
    for rel in _REL:
        if isinstance(e, rel):
            return rel(to_kiln(e.lhs), to_kiln(e.rhs), evaluate=False)
    raise DynamicShapeUnsupported(f"a size guard {e} has no form kiln can check")


def relation_source(e: sympy.Basic, index: Callable[[sympy.Expr], str], cpp: bool = False) -> str:
    """A relation of ``shape_relations`` as Python (or C++: ``cpp``), its sizes printed by ``index``."""
    if isinstance(e, (sympy.And, sympy.Or)):
        op = (" && " if cpp else " and ") if isinstance(e, sympy.And) else (" || " if cpp else " or ")
        return "(" + op.join(relation_source(a, index, cpp) for a in e.args) + ")"
    if isinstance(e, sympy.Not):
        return f"{'!' if cpp else 'not '}({relation_source(e.args[0], index, cpp)})"
    for rel, op in _REL.items():
        if isinstance(e, rel):
            return f"{index(e.lhs)} {op} {index(e.rhs)}"
    raise DynamicShapeUnsupported(f"a size guard {e} has no source form here")
