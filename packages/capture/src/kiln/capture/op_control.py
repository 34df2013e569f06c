"""Opcode family: jumps, loops, returns, with-blocks, exceptions, generators and assertions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .builtins_impl import set_grad_mode
from .errors import GraphBreak
from .generators import TracedGenerator
from .op_registry import handler_table
from .semantics import get_iter, truth
from .size_one_branch import run_neutral_arm
from .values import (
    NULL,
    AutocastContext,
    ContextExit,
    ExceptionValue,
    GradModeContext,
    InterpIterator,
    NullContext,
    ResumedAutocast,
)
from .version import PY

if TYPE_CHECKING:
    from .frame import Frame, Inst

HANDLERS, op = handler_table()


@op("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
    "JUMP_ABSOLUTE")
def jump(f: Frame, i: Inst) -> None:
    f.jump(i.argval)


def _cond_jump(when: bool):
    def handler(f: Frame, i: Inst) -> None:
        v = f.stack[-1]
        if isinstance(v, torch.SymBool) and run_neutral_arm(f, i, v, when):
            return
        taken = truth(f, v) == when
        f.pop()
        if taken:
            f.jump(i.argval)
    return handler


for _name, _when in (("POP_JUMP_IF_TRUE", True), ("POP_JUMP_FORWARD_IF_TRUE", True),
                     ("POP_JUMP_BACKWARD_IF_TRUE", True), ("POP_JUMP_IF_FALSE", False),
                     ("POP_JUMP_FORWARD_IF_FALSE", False), ("POP_JUMP_BACKWARD_IF_FALSE", False)):
    HANDLERS[_name] = _cond_jump(_when)


def _none_jump(when_none: bool):
    def handler(f: Frame, i: Inst) -> None:
        v = f.pop()
        if (v is None) == when_none:
            f.jump(i.argval)
    return handler


for _name, _when in (("POP_JUMP_IF_NONE", True), ("POP_JUMP_FORWARD_IF_NONE", True),
                     ("POP_JUMP_BACKWARD_IF_NONE", True), ("POP_JUMP_IF_NOT_NONE", False),
                     ("POP_JUMP_FORWARD_IF_NOT_NONE", False), ("POP_JUMP_BACKWARD_IF_NOT_NONE", False)):
    HANDLERS[_name] = _none_jump(_when)


@op("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
def jump_or_pop(f: Frame, i: Inst) -> None:
    want = i.opname == "JUMP_IF_TRUE_OR_POP"
    if truth(f, f.stack[-1]) == want:
        f.jump(i.argval)
    else:
        f.pop()


@op("GET_ITER")
def get_iter_op(f: Frame, i: Inst) -> None:
    f.push(get_iter(f, f.pop()))


@op("FOR_ITER")
def for_iter(f: Frame, i: Inst) -> None:
    it = f.stack[-1]
    if not isinstance(it, InterpIterator):
        raise GraphBreak(f"iterating {type(it).__name__}")
    try:
        f.push(it.next())
    except StopIteration:
        f.pop()
        target = f.index_of[i.argval]
        if PY >= (3, 12) and f.insts[target].opname == "END_FOR":
            target += 1
            if PY >= (3, 13) and f.insts[target].opname == "POP_TOP":
                target += 1
        f.ip = target


@op("END_FOR")
def end_for(f: Frame, i: Inst) -> None:
    f.pop()
    if PY < (3, 13):
        f.pop()


@op("RETURN_VALUE")
def return_value(f: Frame, i: Inst) -> None:
    f.result.value = f.pop()
    f.result.returned = True


@op("RETURN_CONST")
def return_const(f: Frame, i: Inst) -> None:
    f.result.value = i.argval
    f.result.returned = True


# ---- generators (generators.py: a generator's frame runs from yield to yield) ----------------
@op("RETURN_GENERATOR")
def return_generator(f: Frame, i: Inst) -> None:
    if not f.is_generator or f.is_top():
        raise GraphBreak("generator in an unexpected place")
    f.push(None)  # the value the first ``next`` sends, popped by the POP_TOP that follows


@op("YIELD_VALUE")
def yield_value(f: Frame, i: Inst) -> None:
    if not f.is_generator or f.is_top():
        raise GraphBreak("yield outside a generator")
    f.yielded = f.pop()
    f.suspended = True  # resumed by TracedGenerator.send, which pushes the sent value


@op("GET_YIELD_FROM_ITER")
def get_yield_from_iter(f: Frame, i: Inst) -> None:
    if not isinstance(f.stack[-1], InterpIterator):
        f.push(get_iter(f, f.pop()))


@op("SEND")
def send(f: Frame, i: Inst) -> None:
    """``yield from``: advance the sub-iterator; when it ends, its return value replaces it (3.11)
    or is pushed above it for END_SEND (3.12+), and the loop is left."""
    value = f.pop()
    receiver = f.stack[-1]
    try:
        if isinstance(receiver, TracedGenerator):
            out = receiver.send(value)
        elif value is None and isinstance(receiver, InterpIterator):
            out = receiver.next()
        else:
            raise GraphBreak(f"yield from / send into {type(receiver).__name__}")
    except StopIteration as e:
        if PY < (3, 12):
            f.stack[-1] = e.value
        else:
            f.push(e.value)
        f.jump(i.argval)
        return
    f.push(out)


@op("END_SEND")
def end_send(f: Frame, i: Inst) -> None:
    value = f.pop()
    f.pop()  # the finished sub-iterator
    f.push(value)


@op("GEN_START")
def gen_start(f: Frame, i: Inst) -> None:
    f.pop()


# ---- with-blocks ---------------------------------------------------------------------------
def enter_context(f: Frame, ctx: Any) -> Any:
    if isinstance(ctx, GradModeContext):
        if ctx.prev is None:
            ctx.prev = torch.is_grad_enabled()
            set_grad_mode(f, ctx.enabled)
        return None
    if isinstance(ctx, NullContext):
        return ctx.real.__enter__()
    if isinstance(ctx, AutocastContext):
        ctx.real = torch.autocast(ctx.device_type, dtype=ctx.dtype, enabled=ctx.enabled,
                                  cache_enabled=ctx.cache_enabled)
        ctx.real.__enter__()
        f.ctx.open_autocasts.append(ctx.real)
        ctx.node = f.tracer.graph.call_function(
            torch.amp.autocast_mode._enter_autocast,
            (ctx.device_type, ctx.real.fast_dtype, ctx.enabled, ctx.real._cache_enabled))
        return None
    enter = getattr(type(ctx), "__enter__", None)
    if enter is not None and hasattr(enter, "__code__"):
        return f.call(enter, [ctx], {})
    raise GraphBreak(f"with-block on {type(ctx).__qualname__}",
                     "supported: torch.no_grad/enable_grad/set_grad_enabled and Python context managers")


def exit_context(f: Frame, ctx: Any, exc: Any = None) -> Any:
    if isinstance(ctx, GradModeContext):
        set_grad_mode(f, bool(ctx.prev))
        return False
    if isinstance(ctx, NullContext):
        return ctx.real.__exit__(None, None, None)
    if isinstance(ctx, ResumedAutocast):
        # the graph goes on in the state from before the block, entered as a block of its own that the
        # graph closes at its end (capture.py); the real block is left after the graph
        real = torch.autocast(ctx.device_type, dtype=ctx.prev_dtype, enabled=ctx.prev_enabled,
                              cache_enabled=ctx.prev_cache_enabled)
        real.__enter__()
        f.ctx.open_autocasts.append(real)
        node = f.tracer.graph.call_function(
            torch.amp.autocast_mode._enter_autocast,
            (ctx.device_type, ctx.prev_dtype, ctx.prev_enabled, ctx.prev_cache_enabled))
        f.tracer.resumed_autocasts.append((node, ctx.source))
        return False
    if isinstance(ctx, AutocastContext):
        ctx.real.__exit__(None, None, None)
        if ctx.real in f.ctx.open_autocasts:
            f.ctx.open_autocasts.remove(ctx.real)
        f.tracer.graph.call_function(torch.amp.autocast_mode._exit_autocast, (ctx.node,))
        return False
    exit_fn = type(ctx).__exit__
    if exc is None:
        return f.call(exit_fn, [ctx, None, None, None], {})
    return f.call(exit_fn, [ctx, type(exc), exc, None], {})


@op("BEFORE_WITH", "BEFORE_ASYNC_WITH")
def before_with(f: Frame, i: Inst) -> None:
    ctx = f.pop()
    value = enter_context(f, ctx)
    f.push(ContextExit(ctx))
    f.push(value)


@op("LOAD_SPECIAL")
def load_special(f: Frame, i: Inst) -> None:  # 3.14-style; kept for completeness
    raise GraphBreak("LOAD_SPECIAL")


@op("WITH_EXCEPT_START")
def with_except_start(f: Frame, i: Inst) -> None:
    exc = f.stack[-1]
    exit_obj = f.stack[-4] if PY < (3, 12) or PY >= (3, 12) else None
    if not isinstance(exit_obj, ContextExit):
        exit_obj = next((s for s in reversed(f.stack) if isinstance(s, ContextExit)), None)
    if exit_obj is None:
        raise GraphBreak("exception inside a with-block")
    f.push(exit_context(f, exit_obj.ctx, exc))


# ---- exceptions ----------------------------------------------------------------------------
@op("PUSH_EXC_INFO")
def push_exc_info(f: Frame, i: Inst) -> None:
    exc = f.pop()
    f.push(f.exc_stack[-1] if f.exc_stack else None)
    f.exc_stack.append(exc)
    f.push(exc)


@op("POP_EXCEPT")
def pop_except(f: Frame, i: Inst) -> None:
    f.pop()
    if f.exc_stack:
        f.exc_stack.pop()


@op("CHECK_EXC_MATCH")
def check_exc_match(f: Frame, i: Inst) -> None:
    cls = f.pop()
    exc = f.stack[-1]
    f.push(isinstance(exc, cls))


@op("RERAISE")
def reraise(f: Frame, i: Inst) -> None:
    exc = f.pop()
    if i.arg:
        f.pop()  # lasti
    raise exc.exc if isinstance(exc, ExceptionValue) else exc


@op("RAISE_VARARGS")
def raise_varargs(f: Frame, i: Inst) -> None:
    if i.arg == 0:
        if not f.exc_stack:
            raise RuntimeError("No active exception to reraise")
        raise f.exc_stack[-1]
    cause = f.pop() if i.arg == 2 else None
    exc = f.pop()
    if isinstance(exc, type):
        exc = f.call(exc, [], {})
    if cause is not None:
        exc.__cause__ = cause
    raise exc


@op("LOAD_ASSERTION_ERROR")
def load_assertion_error(f: Frame, i: Inst) -> None:
    f.push(AssertionError)


@op("POP_BLOCK", "SETUP_FINALLY", "SETUP_WITH", "SETUP_CLEANUP")
def pseudo(f: Frame, i: Inst) -> None:
    pass


@op("CLEANUP_THROW", "GET_AWAITABLE", "GET_AITER", "GET_ANEXT", "END_ASYNC_FOR", "ASYNC_GEN_WRAP")
def unsupported_generator(f: Frame, i: Inst) -> None:
    raise GraphBreak(f"{i.opname} (coroutines, generator.throw)")


__all__ = ["HANDLERS", "NULL"]
