"""Running the instruction a frame broke at, in Python, between the graph and the resume function."""

from __future__ import annotations

import operator
import types
from collections.abc import Callable
from typing import Any

from .errors import SkipFrame
from .frame import Inst, decode
from .op_arith import binary_operator, compare_operator
from .semantics import COMPARE_OPS
from .version import PY


class _Next:
    """Marks a NULL stack slot in the Python-side stack (PUSH_NULL in the resume prologue)."""

    def __repr__(self) -> str:
        return "NULL"


NEXT = _Next()

_JUMP_TRUE = {"POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE"}
_JUMP_FALSE = {"POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE"}
CAN_RUN = {"CALL", "CALL_KW", "CALL_FUNCTION_EX", "TO_BOOL", "COMPARE_OP", "BINARY_OP", "STORE_ATTR",
           "STORE_SUBSCR", "BINARY_SUBSCR", "UNARY_NOT", "GET_ITER", "FOR_ITER", "LOAD_ATTR", "LOAD_METHOD",
           *_JUMP_TRUE, *_JUMP_FALSE}


def _next_offset(code: types.CodeType, inst: Inst) -> int:
    insts, _, _ = decode(code)
    return insts[inst.index + 1].offset


def _split_call(items: list, kwnames: tuple) -> tuple[Any, list, dict]:
    lower, upper, *args = items
    if PY >= (3, 13):
        fn = lower
        if upper is not NEXT:
            args = [upper, *args]
    elif lower is NEXT:
        fn = upper
    else:
        fn, args = lower, [upper, *args]
    kwargs: dict = {}
    if kwnames:
        n = len(kwnames)
        kwargs = dict(zip(kwnames, args[-n:]))
        args = args[:-n]
    return fn, args, kwargs


def execute_in_python(code: types.CodeType, inst: Inst, stack: list, kw_names: tuple | None,
                      wrap: Callable[[Any], Any]) -> tuple[list, int]:
    """Apply ``inst`` to a real stack; returns the new stack and the offset to resume at."""
    name = inst.opname
    nxt = _next_offset(code, inst)
    if name == "CALL":
        n = inst.arg + 2
        items = stack[-n:]
        del stack[-n:]
        fn, args, kwargs = _split_call(items, kw_names or ())
        stack.append(wrap(fn)(*args, **kwargs))
        return stack, nxt
    if name == "CALL_KW":
        kwnames = stack.pop()
        n = inst.arg + 2
        items = stack[-n:]
        del stack[-n:]
        fn, args, kwargs = _split_call(items, kwnames)
        stack.append(wrap(fn)(*args, **kwargs))
        return stack, nxt
    if name == "CALL_FUNCTION_EX":
        kwargs = stack.pop() if (inst.arg or 0) & 1 else {}
        args = stack.pop()
        if PY >= (3, 13):
            null = stack.pop()
            fn = stack.pop()
            if null is not NEXT:
                args = [null, *args]
        else:
            fn = stack.pop()
            if stack and stack[-1] is NEXT:
                stack.pop()
        stack.append(wrap(fn)(*args, **(kwargs or {})))
        return stack, nxt
    if name in _JUMP_TRUE or name in _JUMP_FALSE:
        v = bool(stack.pop())
        taken = v if name in _JUMP_TRUE else not v
        return stack, (inst.argval if taken else nxt)
    if name == "TO_BOOL":
        stack.append(bool(stack.pop()))
        return stack, nxt
    if name == "UNARY_NOT":
        stack.append(not stack.pop())
        return stack, nxt
    if name == "COMPARE_OP":
        b, a = stack.pop(), stack.pop()
        r = COMPARE_OPS[compare_operator(inst)](a, b)
        stack.append(bool(r) if PY >= (3, 13) and inst.arg & 16 else r)
        return stack, nxt
    if name == "BINARY_OP":
        b, a = stack.pop(), stack.pop()
        stack.append(binary_operator(inst)(a, b))
        return stack, nxt
    if name in ("LOAD_ATTR", "LOAD_METHOD"):
        value = getattr(stack.pop(), inst.argval)
        method_form = name == "LOAD_METHOD" or PY >= (3, 12) and (inst.arg or 0) & 1
        if not method_form:
            stack.append(value)
        elif PY >= (3, 13):  # callable, then self-or-NULL
            stack += [value, NEXT]
        else:  # NULL-or-callable, then callable-or-self
            stack += [NEXT, value]
        return stack, nxt
    if name == "STORE_ATTR":
        obj, value = stack.pop(), stack.pop()
        setattr(obj, inst.argval, value)
        return stack, nxt
    if name == "STORE_SUBSCR":
        key, obj, value = stack.pop(), stack.pop(), stack.pop()
        obj[key] = value
        return stack, nxt
    if name == "BINARY_SUBSCR":
        key, obj = stack.pop(), stack.pop()
        stack.append(obj[key])
        return stack, nxt
    if name == "GET_ITER":
        stack.append(iter(stack.pop()))
        return stack, nxt
    if name == "FOR_ITER":
        try:
            stack.append(next(stack[-1]))
            return stack, nxt
        except StopIteration:
            stack.pop()
            insts, index_of, _ = decode(code)
            target = index_of[inst.argval]
            if PY >= (3, 12) and insts[target].opname == "END_FOR":
                target += 1
                if PY >= (3, 13) and insts[target].opname == "POP_TOP":
                    target += 1
            return stack, insts[target].offset
    raise SkipFrame(f"cannot run {name} in Python after a graph break")


__all__ = ["CAN_RUN", "NEXT", "execute_in_python", "operator"]
