"""Dropping guards that other guards of the same set imply (fewer guards: a smaller manifest, a
cheaper check to build at every load, the same answer on every input).

EQUALS_MATCH compares the type (and for a tuple every item's type, ``guards_plan.typed_equal``),
so a source's EQUALS_MATCH implies its TYPE_MATCH, LENGTH_MATCH and NOT_NONE, and everything about
its items (``s[0]``, ``s[1]``: the constant tuple holds them). TENSOR_MATCH and TYPE_MATCH (of a
type other than None's) imply NOT_NONE; DICT_KEYS implies LENGTH_MATCH. Only guards in the same
set count: ID_MATCH implies nothing here, because artifacts drop it (not portable) and what it
implied must then still be checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .guards_plan import typed_equal

if TYPE_CHECKING:  # guards.py imports this module
    from .guards import Guard

_ITEM = re.compile(r"^(.*)\[(-?\d+)\]$")
_NONE_TYPE = "builtins:NoneType"


def _type_name(v: object) -> str:
    t = type(v)
    return f"{t.__module__}:{t.__qualname__}"


def _implied_by_value(g: Guard, value: Any) -> bool:
    """Whether ``g`` holds for every x that passes EQUALS_MATCH(x, value) (typed equality)."""
    if g.kind == "EQUALS_MATCH":
        return typed_equal(g.expected, value)
    if g.kind == "TYPE_MATCH":
        return g.expected == _type_name(value)
    if g.kind == "LENGTH_MATCH":
        return isinstance(value, (tuple, str, frozenset)) and g.expected == len(value)
    if g.kind == "NOT_NONE":
        return value is not None
    if g.kind == "IS_NONE":
        return value is None
    return False


def _constant_of(source: str, constants: dict[str, Any], *, own: bool = True) -> tuple[bool, Any]:
    """(True, the value) when an EQUALS_MATCH of ``source`` (unless not ``own``) or of a tuple it
    indexes into pins it."""
    if own and source in constants:
        return True, constants[source]
    m = _ITEM.match(source)
    if m is None:
        return False, None
    known, parent = _constant_of(m.group(1), constants)
    if not known or type(parent) is not tuple:
        return False, None
    i = int(m.group(2))
    if not -len(parent) <= i < len(parent):
        return False, None
    return True, parent[i]


def simplify_guards(guards: Sequence[Guard]) -> tuple[Guard, ...]:
    """``guards`` without exact duplicates and without the ones the others imply (order kept)."""
    constants: dict[str, Any] = {}
    kinds: dict[str, dict[str, Any]] = {}
    for g in guards:
        kinds.setdefault(g.source, {}).setdefault(g.kind, g.expected)
        if g.kind == "EQUALS_MATCH" and g.source and g.source not in constants:
            constants[g.source] = g.expected
    out: list[Guard] = []
    seen: set[tuple[str, str, Any]] = set()
    for g in guards:
        try:
            key = (g.source, g.kind, g.expected)
            if key in seen:
                continue
            seen.add(key)
        except TypeError:  # an unhashable expected value: keep it, compare nothing
            pass
        if g.source and _implied(g, constants, kinds.get(g.source, {})):
            continue
        out.append(g)
    return tuple(out)


def _implied(g: Guard, constants: dict[str, Any], same_source: dict[str, Any]) -> bool:
    if g.kind in ("EQUALS_MATCH", "TYPE_MATCH", "LENGTH_MATCH", "NOT_NONE", "IS_NONE"):
        # an EQUALS_MATCH is implied by its parent tuple's, never by itself
        known, value = _constant_of(g.source, constants, own=g.kind != "EQUALS_MATCH")
        if known and _implied_by_value(g, value):
            return True
    if g.kind == "NOT_NONE":
        t = same_source.get("TYPE_MATCH")
        return "TENSOR_MATCH" in same_source or (t is not None and t != _NONE_TYPE)
    if g.kind == "LENGTH_MATCH" and "DICT_KEYS" in same_source:
        keys = same_source["DICT_KEYS"]
        return isinstance(keys, tuple) and len(keys) == g.expected
    return False
