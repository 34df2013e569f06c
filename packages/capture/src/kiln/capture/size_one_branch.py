"""Branches on a size being 1 whose arm changes nothing at size 1: no guard, one graph for both.

Note: HF's masking code reads ``if batch_size != position_ids.shape[0]: position_ids =
position_ids.expand(batch_size, -1)`` with position ids of batch 1. Traced at a batch of 5 the arm
runs, and guarding ``batch != 1`` gives batch 1 a graph of its own, though at batch 1 the arm only
expands ``[1, n]`` to ``[1, n]``: skipping it or running it computes the same values. So where a
conditional jump's condition is a question about one size symbol that may be 1 (``shape_env.py``),
the example runs straight into the arm and a size of 1 would jump over it, the arm is run with the
guard held back, and it is dropped when the arm proves neutral at size 1:

- the arm is straight-line code of loads, stores and calls (no jumps, no cells, no new locals);
- each call in it records one ``expand`` / ``reshape`` / ``view`` node, and it records nothing else
  but reads of sizes; it inlines no function, adds no graph input and leaves every side effect the
  trace tracks (attribute and container writes, deferred calls, grad mode, RNG) as it was; the
  stack is the same objects;
- every local it rebinds holds a tensor made by those nodes from the tensor the local held before,
  of the same shape once the symbol is 1.

A size-1 call then runs the arm's views where eager skips them: equal values, and strides that
differ only on a dim of size 1 (which no index reads), as for the layouts ``shape_env.py`` answers
without a guard. Anything else (an arm that fails a check, raises, or breaks the graph) is traced as
before, with the guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy
import torch

from .shape_env import CaptureShapeEnv, about_one

if TYPE_CHECKING:
    from .frame import Frame, Inst

# what a neutral arm may execute: loads, subscripts, stores to fast locals and calls
_ARM_OPS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_CONST", "LOAD_SMALL_INT",
                      "STORE_FAST", "LOAD_METHOD", "LOAD_ATTR", "PRECALL", "CALL", "CALL_KW", "KW_NAMES",
                      "PUSH_NULL", "NOP", "BINARY_SUBSCR", "LOAD_GLOBAL", "LOAD_DEREF", "POP_TOP"})
_CALLS = frozenset({"CALL", "CALL_KW"})
_VIEWS = frozenset({"expand", "reshape", "view"})


@dataclass(frozen=True, slots=True)
class _Before:
    """The frame and trace as the arm found them."""

    stack: list[Any]
    locals: dict[str, Any]
    checkpoint: tuple
    tail: Any  # the graph's last node
    inputs: int
    spawned: int


def run_neutral_arm(f: Frame, i: Inst, v: Any, when: bool) -> bool:
    """For a conditional jump (taken when the condition is ``when``) on the SymBool ``v``: run the arm
    the example falls into, guarding the condition only when the arm is not neutral at size 1.
    False (nothing done) where the case does not apply."""
    env = f.tracer.shape_env
    if not isinstance(v, torch.SymBool) or not isinstance(env, CaptureShapeEnv):
        return False
    expr, hint = v.node.expr, v.node.hint
    symbols = expr.free_symbols
    if type(hint) is not bool or len(symbols) != 1 or not symbols <= env.may_be_one or not about_one(expr):
        return False
    (sym,) = symbols
    at_one = expr.xreplace({sym: 1})
    if at_one not in (sympy.true, sympy.false) or hint == when or bool(at_one) != when:
        return False  # the example jumps, or size 1 takes the same way
    target = f.index_of.get(i.argval)
    if target is None or target <= i.index + 1 or \
            any(ins.opname not in _ARM_OPS for ins in f.insts[i.index + 1:target]):
        return False
    f.pop()
    before = _Before(list(f.stack), dict(f.locals), f.tracer.checkpoint(), f.tracer.graph._root.prev,
                     len(f.tracer.inputs), f.ctx.spawned)
    calls = 0
    try:
        while f.ip < target:
            inst = f.insts[f.ip]
            calls += inst.opname in _CALLS
            f.step(inst)
    except Exception:  # noqa: BLE001 - undone; the ordinary path runs it again, guarded
        f.tracer.rollback(before.checkpoint)
        f.stack[:] = [*before.stack, v]
        f.locals.clear()
        f.locals.update(before.locals)
        f.ip = i.index
        return False
    if f.ip != target or not _neutral_at_one(f, sym, before, calls):
        env.evaluate_expr(expr)  # the guard the ordinary path records
    return True


def _neutral_at_one(f: Frame, sym: sympy.Symbol, before: _Before, calls: int) -> bool:
    tracer = f.tracer
    if len(f.stack) != len(before.stack) or any(a is not b for a, b in zip(f.stack, before.stack, strict=True)):
        return False
    if tracer.checkpoint()[1:] != before.checkpoint[1:] or len(tracer.inputs) != before.inputs or \
            f.ctx.spawned != before.spawned:
        return False
    made = set()
    node = tracer.graph._root.prev
    while node is not before.tail:
        if not (node.op == "call_method" and node.target in _VIEWS or _reads_sizes(node)):
            return False
        if node.op == "call_method" and node.target in _VIEWS:
            made.add(node)
        node = node.prev
    if len(made) != calls:  # a call that recorded no view (list.append, len, print) may have done anything
        return False
    if f.locals.keys() != before.locals.keys():
        return False
    for name, new in f.locals.items():
        old = before.locals[name]
        if new is not old and not _view_of(tracer, new, old, made, sym):
            return False
    return True


def _reads_sizes(node: Any) -> bool:
    """A node that reads or combines sizes (``x.shape[0]``): no tensor, no effect."""
    if node.op == "call_method" and node.target == "size":
        return True
    val = node.meta.get("val")
    return node.op in ("call_method", "call_function") and \
        (isinstance(val, (int, torch.SymInt)) or isinstance(val, (tuple, torch.Size)) and
         all(isinstance(v, (int, torch.SymInt)) for v in val))


def _view_of(tracer: Any, new: Any, old: Any, made: set, sym: sympy.Symbol) -> bool:
    """``new`` is made from ``old`` by the arm's view nodes, and has its shape when ``sym`` is 1."""
    if not isinstance(new, torch.Tensor) or not isinstance(old, torch.Tensor):
        return False
    if [_at_one(d, sym) for d in new.shape] != [_at_one(d, sym) for d in old.shape]:
        return False
    node, source = tracer.node_of.get(id(new)), tracer.node_of.get(id(old))
    while node in made:
        node = node.args[0]
    return node is not None and node is source


def _at_one(d: Any, sym: sympy.Symbol) -> Any:
    return sympy.expand(d.node.expr.xreplace({sym: 1})) if isinstance(d, torch.SymInt) else sympy.Integer(d)
