"""Shape guards: size symbols bound to their sources, their ranges, and ShapeEnv's recorded guards,
printed as Python expressions over symbol names (GuardSet's SHAPE_EXPR kind evaluates them)."""

from __future__ import annotations

import sympy

from kiln.graph import Guard

_REL = {"Equality": "==", "Unequality": "!=", "StrictLessThan": "<", "LessThan": "<=",
        "StrictGreaterThan": ">", "GreaterThan": ">="}


def py_expr(e: sympy.Basic) -> str:
    """Print a sympy boolean/integer expression as Python (no sympy needed to evaluate it)."""
    name = type(e).__name__
    if isinstance(e, sympy.Symbol):
        return str(e)
    if isinstance(e, sympy.Integer):
        return str(int(e))
    if isinstance(e, sympy.Rational):
        return f"({e.p}/{e.q})"
    if e is sympy.true:
        return "True"
    if e is sympy.false:
        return "False"
    args = [py_expr(a) for a in e.args]
    if name in _REL:
        return f"({args[0]} {_REL[name]} {args[1]})"
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(args) + ")"
    if isinstance(e, sympy.Pow):
        return f"({args[0]} ** {args[1]})"
    if isinstance(e, sympy.And):
        return "(" + " and ".join(args) + ")"
    if isinstance(e, sympy.Or):
        return "(" + " or ".join(args) + ")"
    if isinstance(e, sympy.Not):
        return f"(not {args[0]})"
    if name in ("FloorDiv", "IntTrueDiv") and len(args) == 2:
        return f"({args[0]} // {args[1]})" if name == "FloorDiv" else f"({args[0]} / {args[1]})"
    if name in ("Mod", "PythonMod"):
        return f"({args[0]} % {args[1]})"
    if name in ("Max",):
        return f"max({', '.join(args)})"
    if name in ("Min",):
        return f"min({', '.join(args)})"
    if name in ("CeilToInt", "ceiling"):
        return f"(-((-{args[0]}) // 1))"
    if name in ("FloorToInt", "floor"):
        return f"({args[0]} // 1)"
    raise NotImplementedError(f"cannot print shape guard {e} ({name})")


def shape_guards(shape_env, symbol_sources: dict[str, list[str]]) -> list[Guard]:
    """SYMBOL guards binding each symbol, then its range, then every guard ShapeEnv recorded."""
    out: list[Guard] = []
    if shape_env is None:
        return out
    for name, sources in symbol_sources.items():
        for src in sources:
            out.append(Guard(src, "SYMBOL", name, "dynamic size"))
    for sym, vr in shape_env.var_to_range.items():
        if str(sym) not in symbol_sources:
            continue
        for bound, op in ((vr.lower, ">="), (vr.upper, "<=")):
            try:
                value = int(bound)
            except Exception:  # infinite bounds (int_oo) have no integer value
                continue
            out.append(Guard("", "SHAPE_EXPR", f"{sym} {op} {value}", "size range"))
    seen: set[str] = set()
    for g in shape_env.guards:
        text = py_expr(g.expr)
        if text in seen:
            continue
        seen.add(text)
        out.append(Guard("", "SHAPE_EXPR", text, "shape assumption"))
    return out
