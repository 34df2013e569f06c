"""Shape guards: size symbols bound to their sources, their ranges, and ShapeEnv's recorded guards,
printed as Python expressions over symbol names (GuardSet's SHAPE_EXPR kind evaluates them)."""

from __future__ import annotations

import math

from kiln.graph import Guard, py_expr

STRIDE_NOTE = "input stride"  # the note of a relation pinning an input's symbolic stride (tracer.py)


def shape_guards(shape_env, symbol_sources: dict[str, list[str]]) -> list[Guard]:
    """SYMBOL guards binding each symbol, then its range, then every guard ShapeEnv recorded."""
    out: list[Guard] = []
    if shape_env is None:
        return out
    for name, sources in symbol_sources.items():
        for src in sources:
            out.append(Guard(src, "SYMBOL", name, "dynamic size"))
    named = set(symbol_sources)
    referenced = {str(x) for g in shape_env.guards for x in g.expr.free_symbols}
    for name, src in _unbound_sources(shape_env, named):
        if name in referenced:  # only symbols a recorded relation names (kiln.export refuses others)
            out.append(Guard(src, "SYMBOL", name, "dynamic size (of a view input's base)"))
            named.add(name)
    for sym, vr in shape_env.var_to_range.items():
        if str(sym) not in named:
            continue
        is_float = bool(getattr(vr, "is_float", False))  # a float argument's symbol: bounds are floats
        for bound, op in ((vr.lower, ">="), (vr.upper, "<=")):
            try:
                value: int | float = float(bound) if is_float else int(bound)
            except Exception:  # infinite bounds (int_oo) have no integer value
                continue
            if is_float and not math.isfinite(value):
                continue
            out.append(Guard("", "SHAPE_EXPR", f"{sym} {op} {value!r}", "size range"))
    seen: set[str] = set()
    for g in shape_env.guards:
        text = py_expr(g.expr)
        if text in seen:
            continue
        seen.add(text)
        out.append(Guard("", "SHAPE_EXPR", text, "shape assumption"))
    return out


def _unbound_sources(shape_env, bound: set[str]) -> list[tuple[str, str]]:
    """Symbols the capture did not bind but the fake tensors made, with their source (the base of an
    input that is a view, ``L['out']['logits']._base.size()[0]``: the fake view is made over a fake
    base with sizes of its own); a relation over them would otherwise name an unknown symbol."""
    out = []
    for sym, sources in getattr(shape_env, "var_to_sources", {}).items():
        if str(sym) in bound or not sources:
            continue
        name = sources[0].name
        text = name() if callable(name) else name
        if isinstance(text, str) and text.startswith(("L[", "G[")):
            out.append((str(sym), text))
    return out
