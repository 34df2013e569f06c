"""Opcode family: calls, function creation and imports."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import GraphBreak
from .op_control import exit_context
from .op_registry import handler_table
from .semantics import get_iter
from .values import NULL, ContextExit, TracedFunction
from .version import PY

if TYPE_CHECKING:
    from .frame import Frame, Inst

HANDLERS, op = handler_table()


@op("KW_NAMES")
def kw_names(f: Frame, i: Inst) -> None:
    f.kw_names = i.argval if isinstance(i.argval, tuple) else f.code.co_consts[i.arg]


def split_call(stack_items: list, kwnames: tuple) -> tuple[Any, list, dict]:
    """[callable-or-NULL pair, args...] as the version lays it out -> (fn, args, kwargs)."""
    lower, upper, *args = stack_items
    if PY >= (3, 13):
        fn, self_or_null = lower, upper
        if self_or_null is not NULL:
            args = [self_or_null, *args]
    else:
        if lower is NULL:
            fn = upper
        else:
            fn, args = lower, [upper, *args]
    kwargs: dict[str, Any] = {}
    if kwnames:
        n = len(kwnames)
        kwargs = dict(zip(kwnames, args[-n:]))
        args = args[:-n]
    return fn, args, kwargs


def call_value(f: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    if isinstance(fn, ContextExit):
        return exit_context(f, fn.ctx)
    return f.call(fn, args, kwargs)


@op("CALL")
def call(f: Frame, i: Inst) -> None:
    kwnames = f.kw_names or ()
    f.kw_names = None
    items = f.popn(i.arg + 2)
    fn, args, kwargs = split_call(items, kwnames)
    f.push(call_value(f, fn, args, kwargs))


@op("CALL_KW")
def call_kw(f: Frame, i: Inst) -> None:
    kwnames = f.pop()
    items = f.popn(i.arg + 2)
    fn, args, kwargs = split_call(items, kwnames)
    f.push(call_value(f, fn, args, kwargs))


@op("CALL_FUNCTION_EX")
def call_function_ex(f: Frame, i: Inst) -> None:
    has_kwargs = PY >= (3, 14) or bool(i.arg & 1)
    kwargs = f.pop() if has_kwargs else {}
    if kwargs is NULL or kwargs is None:
        kwargs = {}
    args = f.pop()
    if PY >= (3, 13):
        null = f.pop()
        fn = f.pop()
        if null is not NULL:
            args = [null, *args]
    else:
        fn = f.pop()
        if f.stack and f.stack[-1] is NULL:
            f.pop()
    if not isinstance(args, (list, tuple)):
        args = get_iter(f, args).remaining()
    if not isinstance(kwargs, dict):
        kwargs = {k: kwargs[k] for k in kwargs.keys()}
    f.push(call_value(f, fn, list(args), dict(kwargs)))


_FN_FLAGS = {0x01: "defaults", 0x02: "kwdefaults", 0x04: "annotations", 0x08: "closure",
             0x10: "annotate"}


@op("MAKE_FUNCTION")
def make_function(f: Frame, i: Inst) -> None:
    if PY < (3, 11):
        raise GraphBreak("MAKE_FUNCTION on Python < 3.11")
    code = f.pop()
    fn = TracedFunction(code=code, globals=f.f_globals, name=code.co_name, qualname=code.co_qualname)
    if PY < (3, 13):
        flags = i.arg or 0
        if flags & 0x08:
            fn.closure = tuple(f.pop())
        if flags & 0x04:
            fn.annotations = f.pop()
        if flags & 0x02:
            fn.kwdefaults = dict(f.pop())
        if flags & 0x01:
            fn.defaults = tuple(f.pop())
    f.push(fn)


@op("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(f: Frame, i: Inst) -> None:
    fn = f.pop()
    value = f.pop()
    what = _FN_FLAGS.get(i.arg, "")
    if what == "closure":
        fn.closure = tuple(value)
    elif what == "defaults":
        fn.defaults = tuple(value)
    elif what == "kwdefaults":
        fn.kwdefaults = dict(value)
    elif what in ("annotations", "annotate"):
        fn.annotations = value
    f.push(fn)


@op("IMPORT_NAME")
def import_name(f: Frame, i: Inst) -> None:
    fromlist = f.pop()
    level = f.pop()
    if level:
        raise GraphBreak("relative import inside compiled code")
    module = importlib.import_module(i.argval)
    if not fromlist:
        module = importlib.import_module(i.argval.split(".")[0])
    f.push(module)


@op("IMPORT_FROM")
def import_from(f: Frame, i: Inst) -> None:
    mod = f.stack[-1]
    try:
        f.push(getattr(mod, i.argval))
    except AttributeError:
        f.push(importlib.import_module(f"{mod.__name__}.{i.argval}"))


@op("LOAD_BUILD_CLASS")
def load_build_class(f: Frame, i: Inst) -> None:
    import builtins

    f.push(builtins.__build_class__)  # calls.build_class runs the class body for real
