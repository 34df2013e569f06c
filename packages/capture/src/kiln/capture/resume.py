"""Resume functions: a copy of a code object that restores a stack and locals, then jumps to
an instruction in the middle — how a frame continues after a graph break.

Assembled with the ``bytecode`` library, which rebuilds the exception table and line table, so a
resume point inside a ``with`` or ``try`` block keeps its handlers.
"""

from __future__ import annotations

import inspect
import types

import bytecode
from bytecode import Instr, Label

from .errors import SkipFrame
from .frame import decode

_CACHE: dict[tuple, types.CodeType] = {}


def resume_code(code: types.CodeType, offset: int, null_mask: tuple[bool, ...],
                local_names: tuple[str, ...]) -> types.CodeType:
    """Code taking (stack values that are not NULL..., locals...) and continuing at ``offset``."""
    key = (code, offset, null_mask, local_names)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    insts, index_of, _ = decode(code)
    bc = bytecode.Bytecode.from_code(code)
    instrs = [(k, x) for k, x in enumerate(bc) if isinstance(x, Instr)]
    if len(instrs) != len(insts) or any(x.name != i.opname for (_, x), i in zip(instrs, insts)):
        raise SkipFrame(f"cannot map the bytecode of {code.co_name} for a resume function")
    # the handlers keep the original code's stack depths (bytecode.from_code leaves them 0): the prologue
    # rebuilds the very stack the target had. Computed again from the new code, a handler whose try block
    # starts in the code the prologue jumps over (a ``with`` entered before the break) got the analysis's
    # "unreachable" depth 32768, and an exception the ``with`` suppressed corrupted the frame (a segfault)
    tries = [x for x in bc if isinstance(x, bytecode.TryBegin)]
    table = bytecode.ConcreteBytecode.from_code(code).exception_table
    if len(tries) != len(table):
        raise SkipFrame(f"cannot map the exception table of {code.co_name} for a resume function")
    for t, entry in zip(tries, table, strict=True):
        t.stack_depth = entry.stack_depth
    target_pos, target = instrs[index_of[offset]]
    label = Label()
    bc.insert(target_pos, label)
    resume_at = next((k for k, x in enumerate(bc) if isinstance(x, Instr) and x.name == "RESUME"), None)
    if resume_at is None:
        raise SkipFrame(f"{code.co_name} has no RESUME instruction")
    stack_names = [f"__kiln_stack{offset}_{i}" for i, is_null in enumerate(null_mask) if not is_null]
    loc = target.location
    prologue: list = []
    it = iter(stack_names)
    for is_null in null_mask:
        prologue.append(Instr("PUSH_NULL", location=loc) if is_null else
                        Instr("LOAD_FAST", next(it), location=loc))
    prologue.append(Instr("JUMP_FORWARD", label, location=loc))
    bc[resume_at + 1:resume_at + 1] = prologue
    bc.argnames = stack_names + list(local_names)
    bc.argcount = len(bc.argnames)
    bc.posonlyargcount = 0
    bc.kwonlyargcount = 0
    bc.flags &= ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    bc.name = f"{code.co_name}__kiln_resume_at_{offset}"
    if hasattr(bc, "qualname"):
        bc.qualname = f"{code.co_qualname}__kiln_resume_at_{offset}"
    try:
        # the original's stack size too: every instruction runs on the stack it had there (the analysis
        # of the new code skips the handlers' pushes, and a suppressed exception overflowed the stack)
        new = bc.to_code(stacksize=code.co_stacksize, compute_exception_stack_depths=False)
    except Exception as e:  # the assembler refused: run the frame without capture instead
        raise SkipFrame(f"could not assemble a resume function for {code.co_name}: {e}") from e
    _CACHE[key] = new
    return new


def make_resume_function(code: types.CodeType, f_globals: dict, closure: tuple | None,
                         offset: int, null_mask: tuple[bool, ...],
                         local_names: tuple[str, ...]) -> types.FunctionType:
    new = resume_code(code, offset, null_mask, local_names)
    return types.FunctionType(new, f_globals, new.co_name, None, closure)
