"""Opcode family: arithmetic, comparisons, identity, membership and truth."""

from __future__ import annotations

import dis
import operator
from typing import TYPE_CHECKING, Any

import torch

from .op_registry import handler_table
from .semantics import BINARY_OPS, COMPARE_OPS, apply_operator, contains, truth
from .version import PY

if TYPE_CHECKING:
    from .frame import Frame, Inst

HANDLERS, op = handler_table()


def binary_operator(i: Inst) -> Any:
    return BINARY_OPS[i.argrepr]


@op("BINARY_OP")
def binary_op(f: Frame, i: Inst) -> None:
    b = f.pop()
    a = f.pop()
    f.push(apply_operator(f, binary_operator(i), [a, b]))


_UNARY = {"UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos, "UNARY_INVERT": operator.invert}


@op("UNARY_NEGATIVE", "UNARY_POSITIVE", "UNARY_INVERT")
def unary(f: Frame, i: Inst) -> None:
    f.push(apply_operator(f, _UNARY[i.opname], [f.pop()]))


@op("UNARY_NOT")
def unary_not(f: Frame, i: Inst) -> None:
    f.push(not truth(f, f.pop()))


@op("TO_BOOL")
def to_bool(f: Frame, i: Inst) -> None:
    v = f.pop()
    # a SymBool stays symbolic for the jump that reads it (size_one_branch.py may hold its guard back)
    f.push(v if isinstance(v, torch.SymBool) else truth(f, v))


def compare_operator(i: Inst) -> str:
    if isinstance(i.argval, str) and i.argval in COMPARE_OPS:
        return i.argval
    shift = 5 if PY >= (3, 13) else 4
    return dis.cmp_op[i.arg >> shift]


@op("COMPARE_OP")
def compare_op(f: Frame, i: Inst) -> None:
    b = f.pop()
    a = f.pop()
    result = apply_operator(f, COMPARE_OPS[compare_operator(i)], [a, b])
    if PY >= (3, 13) and i.arg & 16 and not isinstance(result, torch.SymBool):
        result = truth(f, result)  # 3.13's bool(...) compare; a SymBool is left to the jump, as in 3.11
    f.push(result)


@op("IS_OP")
def is_op(f: Frame, i: Inst) -> None:
    b = f.pop()
    a = f.pop()
    f.push((a is not b) if i.arg else (a is b))


@op("CONTAINS_OP")
def contains_op(f: Frame, i: Inst) -> None:
    container = f.pop()
    item = f.pop()
    result = contains(f, item, container)
    f.push((not result) if i.arg else result)


__all__ = ["HANDLERS", "torch"]
