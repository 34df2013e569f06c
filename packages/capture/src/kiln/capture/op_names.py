"""Opcode family: stack manipulation, constants, locals, globals, cells and attributes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import GraphBreak
from .op_registry import handler_table
from .semantics import delete_attr, load_attr, store_attr
from .sources import local_source
from .values import EMPTY, NULL, Cell, SuperProxy
from .version import PY

if TYPE_CHECKING:
    from .frame import Frame, Inst

HANDLERS, op = handler_table()


@op("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "INSTRUMENTED_RESUME", "NOT_TAKEN")
def nop(f: Frame, i: Inst) -> None:
    pass


@op("POP_TOP")
def pop_top(f: Frame, i: Inst) -> None:
    f.pop()


@op("PUSH_NULL")
def push_null(f: Frame, i: Inst) -> None:
    f.push(NULL)


@op("COPY")
def copy(f: Frame, i: Inst) -> None:
    f.push(f.stack[-i.arg])


@op("SWAP")
def swap(f: Frame, i: Inst) -> None:
    f.stack[-1], f.stack[-i.arg] = f.stack[-i.arg], f.stack[-1]


@op("LOAD_CONST", "LOAD_SMALL_INT")
def load_const(f: Frame, i: Inst) -> None:
    f.push(i.argval)


def _load_fast(f: Frame, name: str) -> Any:
    if name in f.cells and name not in f.locals:
        return f.cells[name]  # 3.13 loads cells with LOAD_FAST when building closures
    try:
        return f.locals[name]
    except KeyError:
        raise UnboundLocalError(f"local variable {name!r} referenced before assignment") from None


@op("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW")
def load_fast(f: Frame, i: Inst) -> None:
    f.push(_load_fast(f, i.argval))


@op("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(f: Frame, i: Inst) -> None:
    f.push(f.locals.pop(i.argval, NULL))


@op("LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW")
def load_fast_load_fast(f: Frame, i: Inst) -> None:
    a, b = i.argval
    f.push(_load_fast(f, a))
    f.push(_load_fast(f, b))


@op("STORE_FAST")
def store_fast(f: Frame, i: Inst) -> None:
    v = f.pop()
    if v is NULL:
        f.locals.pop(i.argval, None)
    else:
        f.locals[i.argval] = v


@op("STORE_FAST_STORE_FAST")
def store_fast_store_fast(f: Frame, i: Inst) -> None:
    a, b = i.argval
    f.locals[a] = f.pop()
    f.locals[b] = f.pop()


@op("STORE_FAST_LOAD_FAST")
def store_fast_load_fast(f: Frame, i: Inst) -> None:
    a, b = i.argval
    f.locals[a] = f.pop()
    f.push(_load_fast(f, b))


@op("DELETE_FAST")
def delete_fast(f: Frame, i: Inst) -> None:
    del f.locals[i.argval]


@op("LOAD_GLOBAL")
def load_global(f: Frame, i: Inst) -> None:
    push_null_first = bool(i.arg & 1)
    value = f.load_global(i.argval)
    if push_null_first and PY < (3, 13):
        f.push(NULL)
    f.push(value)
    if push_null_first and PY >= (3, 13):
        f.push(NULL)


@op("LOAD_NAME")
def load_name(f: Frame, i: Inst) -> None:
    if i.argval in f.locals:
        f.push(f.locals[i.argval])
    else:
        f.push(f.load_global(i.argval))


@op("STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME")
def store_global(f: Frame, i: Inst) -> None:
    raise GraphBreak(f"{i.opname} {i.argval} (mutating module globals)")


@op("MAKE_CELL")
def make_cell(f: Frame, i: Inst) -> None:
    name = i.argval
    if name not in f.cells:
        f.cells[name] = Cell(f.locals.pop(name, EMPTY))


@op("COPY_FREE_VARS")
def copy_free_vars(f: Frame, i: Inst) -> None:
    pass  # the frame's closure cells are installed when it is created


@op("LOAD_CLOSURE")
def load_closure(f: Frame, i: Inst) -> None:
    f.push(f.cell(i.argval))


def read_cell(f: Frame, cell: Cell, name: str) -> Any:
    if cell.real is not None:
        try:
            value = cell.real.cell_contents
        except ValueError:
            raise NameError(f"free variable {name!r} referenced before assignment") from None
        return f.tracer.wrap(value, cell.source)
    if cell.value is EMPTY:
        raise NameError(f"free variable {name!r} referenced before assignment")
    return cell.value


@op("LOAD_DEREF", "LOAD_CLASSDEREF")
def load_deref(f: Frame, i: Inst) -> None:
    f.push(read_cell(f, f.cell(i.argval), i.argval))


@op("LOAD_FROM_DICT_OR_DEREF")
def load_from_dict_or_deref(f: Frame, i: Inst) -> None:
    mapping = f.pop()
    if i.argval in mapping:
        f.push(mapping[i.argval])
    else:
        f.push(read_cell(f, f.cell(i.argval), i.argval))


@op("STORE_DEREF")
def store_deref(f: Frame, i: Inst) -> None:
    cell = f.cell(i.argval)
    if cell.real is not None:
        raise GraphBreak(f"assignment to nonlocal {i.argval!r} of a function from outside")
    cell.value = f.pop()


@op("DELETE_DEREF")
def delete_deref(f: Frame, i: Inst) -> None:
    f.cell(i.argval).value = EMPTY


def push_method(f: Frame, obj: Any, name: str) -> None:
    """LOAD_METHOD / LOAD_ATTR with the method bit: the stack gets NULL and the bound attribute."""
    attr = load_attr(f, obj, name)
    if PY >= (3, 13):
        f.push(attr)
        f.push(NULL)
    else:
        f.push(NULL)
        f.push(attr)


@op("LOAD_ATTR")
def load_attr_op(f: Frame, i: Inst) -> None:
    obj = f.pop()
    if PY >= (3, 12) and i.arg & 1:
        name = i.argval if isinstance(i.argval, str) else i.argval[1]
        push_method(f, obj, name)
    else:
        f.push(load_attr(f, obj, i.argval))


@op("LOAD_METHOD")
def load_method(f: Frame, i: Inst) -> None:
    push_method(f, f.pop(), i.argval)


@op("STORE_ATTR")
def store_attr_op(f: Frame, i: Inst) -> None:
    obj = f.pop()
    value = f.pop()
    store_attr(f, obj, i.argval, value)


@op("DELETE_ATTR")
def delete_attr_op(f: Frame, i: Inst) -> None:
    delete_attr(f, f.pop(), i.argval)


@op("LOAD_SUPER_ATTR")
def load_super_attr(f: Frame, i: Inst) -> None:
    self_obj = f.pop()
    cls = f.pop()
    f.pop()  # the global super
    sp = SuperProxy(cls, self_obj)
    name = i.argval
    if i.arg & 1:
        push_method(f, sp, name)
    else:
        f.push(load_attr(f, sp, name))


def local_sources(names: list[str]) -> dict[str, str]:
    return {n: local_source(n) for n in names}
