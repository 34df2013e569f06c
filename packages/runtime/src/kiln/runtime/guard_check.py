"""Guard failures on loaded functions, said plainly: which input, what was expected, what came.

The fast path is ``GuardSet.compile()`` (one generated check). Only when it fails does ``diagnose``
walk the guards one by one and turn the first failure into a ``GuardError`` such as
``input 'x': expected shape (4, 8), got (4, 9)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch

from kiln.graph import Guard, GuardSet, device_matches, global_state

from .errors import GuardError
from .sources import display_name

_SIZE_SITE = re.compile(r"^(.*)\.(?:size\(\)|shape)\[(\d+)\]$")
_STRIDE_SITE = re.compile(r"^(.*)\.stride\(\)\[(\d+)\]$")
_HINT = ("the artifact was compiled for other inputs: call it with matching inputs, recompile, "
         "or call disable_guard_check() if you know they are compatible")


def _shape_text(shape: tuple) -> str:
    inner = ", ".join("*" if s is None else str(s) for s in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def _tensor_problem(value: object, expected: tuple) -> tuple[str, object, object] | None:
    dtype, device, shape, stride, requires_grad = expected
    if not isinstance(value, torch.Tensor):
        return "type", "a tensor", type(value).__name__
    got_dtype = str(value.dtype).removeprefix("torch.")
    if got_dtype != str(dtype).removeprefix("torch."):
        return "dtype", str(dtype).removeprefix("torch."), got_dtype
    if not device_matches(value.device, torch.device(device)):
        return "device", device, str(value.device)
    got_shape = tuple(value.shape)
    if len(got_shape) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got_shape)):
        return "shape", _shape_text(tuple(shape)), _shape_text(got_shape)
    got_stride = tuple(value.stride())
    if any(w is not None and w != g for w, g in zip(stride, got_stride)):
        return "stride", _shape_text(tuple(stride)), _shape_text(got_stride)
    if bool(value.requires_grad) != bool(requires_grad):
        return "requires_grad", requires_grad, value.requires_grad
    return None


def _describe_failure(g: Guard, value: object) -> tuple[str, object, object]:
    """(what, expected, actual) for a failed guard."""
    kind = g.kind
    if kind == "TENSOR_MATCH":
        problem = _tensor_problem(value, g.expected)  # type: ignore[arg-type]
        return problem or ("value", g.expected, value)
    if kind == "TYPE_MATCH":
        got = type(value)
        return "type", str(g.expected).replace(":", "."), f"{got.__module__}.{got.__qualname__}"
    if kind == "LENGTH_MATCH":
        return "length", g.expected, len(value) if hasattr(value, "__len__") else value  # type: ignore[arg-type]
    if kind == "DICT_KEYS":
        return "keys", list(cast(Iterable[Any], g.expected)), list(value.keys()) if isinstance(value, Mapping) else value
    if kind == "IS_NONE":
        return "value", None, type(value).__name__
    if kind == "NOT_NONE":
        return "value", "not None", None
    return "value", g.expected, value


_RANGE = re.compile(r"^(\w+) (>=|<=) (-?\d+)$")


def _shape_error(g: Any, guards: GuardSet, symbols: Mapping[str, Any], sites: Mapping[str, str]) -> GuardError:
    """A failed size relation, said with the inputs' dims it reads: for a range guard, the range."""
    bound = ", ".join(f"{sites.get(k, k)} = {v} ({k})" for k, v in symbols.items() if k in str(g.expected))
    m = _RANGE.match(str(g.expected))
    if m:
        sym = m.group(1)
        lo = hi = None
        for other in guards:
            r = _RANGE.match(str(other.expected)) if other.kind == "SHAPE_EXPR" else None
            if r and r.group(1) == sym:
                lo, hi = (int(r.group(3)), hi) if r.group(2) == ">=" else (lo, int(r.group(3)))
        where = sites.get(sym, sym)
        return GuardError(f"{where}: size {symbols.get(sym)} is outside the range [{lo}, {'inf' if hi is None else hi}] "
                          f"this function was compiled for (symbol {sym}); compile it again with a wider "
                          "kiln.mark_dynamic(t, dim, min=, max=) range", input_name=where,
                          expected=f"{lo} <= {sym} <= {hi}", actual=symbols.get(sym), guard=g)
    return GuardError(f"shape relation {g.expected} does not hold for {bound}; the compiled function assumed "
                      "it (compile it again for these sizes)", input_name="", expected=g.expected, actual=bound,
                      guard=g)


def diagnose(guards: GuardSet, L: Mapping[str, Any], G: Mapping[str, Any],
             names: Mapping[str, str]) -> GuardError:
    """The GuardError for the first failing guard (``names``: guard source -> input name)."""
    symbols: dict[str, Any] = {}
    sites: dict[str, str] = {}  # symbol -> "input 'x' dim 0", where it was first read
    for g in guards:
        label = names.get(g.source) or display_name(g.source)
        if g.kind == "GLOBAL_STATE":
            now = dict(global_state())
            want = dict(g.expected)  # type: ignore[arg-type]
            diff = [k for k in want if now.get(k) != want[k]]
            if diff:
                k = diff[0]
                return GuardError(f"global state {k}: expected {want[k]!r}, got {now.get(k)!r} "
                                  f"({_HINT})", input_name=k, expected=want[k], actual=now.get(k),
                                  guard=g)
            continue
        if g.kind == "SHAPE_EXPR":
            if not eval(str(g.expected), {}, dict(symbols)):  # noqa: S307 - a guard we saved
                return _shape_error(g, guards, symbols, sites)
            continue
        try:
            value = eval(g.source, {"L": L, "G": G})  # noqa: S307
        except Exception as e:  # noqa: BLE001
            return GuardError(f"input {label!r}: cannot read it from the call ({type(e).__name__}: "
                              f"{e})", input_name=label, expected=g.expected, actual=None, guard=g)
        if g.kind == "SYMBOL":
            sym = str(g.expected)
            if sym in symbols and symbols[sym] != value:
                site = _SIZE_SITE.match(g.source)
                stride = _STRIDE_SITE.match(g.source)
                at = site or stride
                if at is not None:
                    label = names.get(at.group(1)) or display_name(at.group(1))
                    what = f"{'size' if site else 'stride'} of dim {at.group(2)}"
                else:
                    what = "size"
                return GuardError(f"input {label!r}: expected {what} {symbols[sym]} (the same value "
                                  f"{sym} as an earlier size), got {value}", input_name=label,
                                  expected=symbols[sym], actual=value, guard=g)
            symbols.setdefault(sym, value)
            if sym not in sites:
                site = _SIZE_SITE.match(g.source)
                sites[sym] = (f"input {names.get(site.group(1)) or display_name(site.group(1))!r} dim "
                              f"{site.group(2)}") if site else f"input {label!r}"
            continue
        if GuardSet((g,)).compile()(L, G):
            continue
        what, expected, actual = _describe_failure(g, value)
        return GuardError(f"input {label!r}: expected {what} {expected}, got {actual}",
                          input_name=label, expected=expected, actual=actual, guard=g)
    return GuardError(f"the guards of this compiled function failed ({_HINT}):\n{guards.as_text()}")
