"""Opcode family: building and unpacking containers, subscripts, slices and string formatting."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .errors import GraphBreak
from .op_registry import handler_table
from .semantics import apply_operator, concrete_key, delitem, get_iter, getitem, setitem
from .values import ListIterator

if TYPE_CHECKING:
    from .frame import Frame, Inst

HANDLERS, op = handler_table()


@op("BUILD_TUPLE")
def build_tuple(f: Frame, i: Inst) -> None:
    f.push(tuple(f.popn(i.arg)))


@op("BUILD_LIST")
def build_list(f: Frame, i: Inst) -> None:
    f.push(list(f.popn(i.arg)))


@op("BUILD_SET")
def build_set(f: Frame, i: Inst) -> None:
    f.push({concrete_key(v) for v in f.popn(i.arg)})


@op("BUILD_MAP")
def build_map(f: Frame, i: Inst) -> None:
    items = f.popn(2 * i.arg)
    f.push({concrete_key(items[k]): items[k + 1] for k in range(0, len(items), 2)})


@op("BUILD_CONST_KEY_MAP")
def build_const_key_map(f: Frame, i: Inst) -> None:
    keys = f.pop()
    values = f.popn(i.arg)
    f.push(dict(zip(keys, values)))


@op("BUILD_STRING")
def build_string(f: Frame, i: Inst) -> None:
    f.push("".join(f.popn(i.arg)))


@op("BUILD_SLICE")
def build_slice(f: Frame, i: Inst) -> None:
    f.push(slice(*f.popn(i.arg)))


def _ensure_iterable_items(f: Frame, x: Any) -> list:
    return list(get_iter(f, x).remaining())


def _writing(f: Frame, target: Any) -> Any:
    """A container about to change in place: an input list/dict (resume functions receive the
    list a comprehension is building) has the write replayed on the real object."""
    if f.tracer.owns_copy(target):
        f.tracer.note_container_write(target)
    return target


@op("LIST_APPEND")
def list_append(f: Frame, i: Inst) -> None:
    v = f.pop()
    _writing(f, f.stack[-i.arg]).append(v)


@op("SET_ADD")
def set_add(f: Frame, i: Inst) -> None:
    v = f.pop()
    f.stack[-i.arg].add(v)


@op("MAP_ADD")
def map_add(f: Frame, i: Inst) -> None:
    v = f.pop()
    k = f.pop()
    _writing(f, f.stack[-i.arg])[k] = v


@op("LIST_EXTEND")
def list_extend(f: Frame, i: Inst) -> None:
    v = f.pop()
    _writing(f, f.stack[-i.arg]).extend(_ensure_iterable_items(f, v))


@op("SET_UPDATE")
def set_update(f: Frame, i: Inst) -> None:
    v = f.pop()
    f.stack[-i.arg].update(_ensure_iterable_items(f, v))


@op("DICT_UPDATE", "DICT_MERGE")
def dict_update(f: Frame, i: Inst) -> None:
    v = f.pop()
    target = _writing(f, f.stack[-i.arg])
    if i.opname == "DICT_MERGE":
        dup = set(target) & set(v.keys())
        if dup:
            raise TypeError(f"got multiple values for keyword argument {sorted(dup)[0]!r}")
    if isinstance(v, dict):
        target.update(v)
    else:
        for k in v.keys():
            target[k] = getitem(f, v, k)


@op("LIST_TO_TUPLE")
def list_to_tuple(f: Frame, i: Inst) -> None:
    f.push(tuple(f.pop()))


@op("UNPACK_SEQUENCE")
def unpack_sequence(f: Frame, i: Inst) -> None:
    seq = f.pop()
    if isinstance(seq, torch.Tensor):
        items = [getitem(f, seq, k) for k in range(i.arg)]
    else:
        items = _ensure_iterable_items(f, seq)
    if len(items) != i.arg:
        raise ValueError(f"expected {i.arg} values to unpack, got {len(items)}")
    for v in reversed(items):
        f.push(v)


@op("UNPACK_EX")
def unpack_ex(f: Frame, i: Inst) -> None:
    before, after = i.arg & 0xFF, i.arg >> 8
    items = _ensure_iterable_items(f, f.pop())
    if len(items) < before + after:
        raise ValueError("not enough values to unpack")
    mid = items[before:len(items) - after]
    out = items[:before] + [mid] + items[len(items) - after:]
    for v in reversed(out):
        f.push(v)


@op("BINARY_SUBSCR")
def binary_subscr(f: Frame, i: Inst) -> None:
    key = f.pop()
    obj = f.pop()
    f.push(getitem(f, obj, key))


@op("STORE_SUBSCR")
def store_subscr(f: Frame, i: Inst) -> None:
    key = f.pop()
    obj = f.pop()
    value = f.pop()
    setitem(f, obj, key, value)


@op("DELETE_SUBSCR")
def delete_subscr(f: Frame, i: Inst) -> None:
    key = f.pop()
    obj = f.pop()
    delitem(f, obj, key)


@op("BINARY_SLICE")
def binary_slice(f: Frame, i: Inst) -> None:
    end = f.pop()
    start = f.pop()
    obj = f.pop()
    f.push(getitem(f, obj, slice(start, end)))


@op("STORE_SLICE")
def store_slice(f: Frame, i: Inst) -> None:
    end = f.pop()
    start = f.pop()
    obj = f.pop()
    value = f.pop()
    setitem(f, obj, slice(start, end), value)


def _concrete(value: Any, depth: int = 0) -> Any:
    """Symbolic sizes formatted into text are specialised (guarded), as int() does."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return float(value) if isinstance(value, torch.SymFloat) else bool(value)
    if depth < 4 and type(value) in (tuple, list, torch.Size):
        items = [_concrete(v, depth + 1) for v in value]
        return tuple(items) if type(value) is tuple else list(items) if type(value) is list else torch.Size(items)
    return value


def _format(f: Frame, value: Any, spec: str = "", conv: int = 0) -> str:
    if isinstance(value, torch.Tensor):
        raise GraphBreak("formatting a tensor into a string")
    value = _concrete(value)
    if conv == 1:
        value = str(value)
    elif conv == 2:
        value = repr(value)
    elif conv == 3:
        value = ascii(value)
    return format(value, spec)


@op("FORMAT_VALUE")
def format_value(f: Frame, i: Inst) -> None:
    spec = f.pop() if (i.arg & 0x04) else ""
    f.push(_format(f, f.pop(), spec, i.arg & 0x03))


@op("FORMAT_SIMPLE")
def format_simple(f: Frame, i: Inst) -> None:
    f.push(_format(f, f.pop()))


@op("FORMAT_WITH_SPEC")
def format_with_spec(f: Frame, i: Inst) -> None:
    spec = f.pop()
    f.push(_format(f, f.pop(), spec))


_CONVERSIONS: dict[int, Callable[[object], str]] = {1: str, 2: repr, 3: ascii}  # CONVERT_VALUE's arg


@op("CONVERT_VALUE")
def convert_value(f: Frame, i: Inst) -> None:
    v = f.pop()
    if isinstance(v, torch.Tensor):
        raise GraphBreak("formatting a tensor into a string")
    f.push(_CONVERSIONS[i.arg](_concrete(v)))


@op("CALL_INTRINSIC_1")
def call_intrinsic_1(f: Frame, i: Inst) -> None:
    name = i.argrepr
    if name == "INTRINSIC_LIST_TO_TUPLE":
        f.push(tuple(f.pop()))
    elif name == "INTRINSIC_UNARY_POSITIVE":
        f.push(apply_operator(f, operator.pos, [f.pop()]))
    elif name == "INTRINSIC_STOPITERATION_ERROR":
        exc = f.pop()
        f.push(RuntimeError("generator raised StopIteration") if isinstance(exc, StopIteration) else exc)
    else:
        raise GraphBreak(f"CALL_INTRINSIC_1 {name}")


@op("GET_LEN")
def get_len(f: Frame, i: Inst) -> None:
    f.push(len(f.stack[-1]))


__all__ = ["HANDLERS", "ListIterator"]
