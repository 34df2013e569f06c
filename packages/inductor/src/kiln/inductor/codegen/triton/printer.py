"""Index expressions (sympy) printed as Triton or plain Python integer expressions.

Index values are non-negative integers, so ``FloorDiv``/``ModIndex`` print as ``//``/``%``: Triton's
integer division truncates and Python's floors, which agree on non-negative operands.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from ...ir import FloorDiv, ModIndex


class IndexPrinter:
    """Prints sympy index expressions; ``names`` renames symbols (e.g. kernel variables)."""

    def __init__(self, names: Mapping[sympy.Symbol, str] | None = None, *, triton: bool = True) -> None:
        self.names = dict(names or {})
        self.triton = triton

    def __call__(self, e: sympy.Expr) -> str:
        return self.doprint(sympy.sympify(e))

    def doprint(self, e: sympy.Expr) -> str:
        if isinstance(e, sympy.Integer):
            return str(int(e))
        if isinstance(e, sympy.Symbol):
            return self.names.get(e, e.name)
        if isinstance(e, sympy.Add):
            return self._add(e)
        if isinstance(e, sympy.Mul):
            return self._mul(e)
        if isinstance(e, sympy.Pow):
            return self._pow(e)
        if isinstance(e, FloorDiv):
            return f"({self._atom(e.args[0])} // {self._atom(e.args[1])})"
        if isinstance(e, ModIndex):
            return f"({self._atom(e.args[0])} % {self._atom(e.args[1])})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = ("tl.maximum" if isinstance(e, sympy.Max) else "tl.minimum") if self.triton else (
                "max" if isinstance(e, sympy.Max) else "min")
            args = [self.doprint(a) for a in e.args]
            out = args[0]
            for a in args[1:]:
                out = f"{fn}({out}, {a})"
            return out
        if isinstance(e, sympy.Rational) and e.q != 1:
            raise ValueError(f"index expression {e} is not an integer")
        raise NotImplementedError(f"cannot print index expression {e!r} ({type(e).__name__}) for Triton")

    def _atom(self, e: sympy.Expr) -> str:
        s = self.doprint(e)
        if isinstance(e, (sympy.Integer, sympy.Symbol)) and not s.startswith("-"):
            return s
        return s if s.startswith("(") and _balanced(s[1:-1]) else f"({s})"

    def _add(self, e: sympy.Add) -> str:
        terms = sorted(e.args, key=sympy.default_sort_key)
        # constants last, for readability: x0 + 16*x1 + 3
        def negative(t: sympy.Expr) -> bool:
            return bool(t.as_coeff_Mul()[0] < 0)
        terms = ([t for t in terms if not t.is_number and not negative(t)]
                 + [t for t in terms if not t.is_number and negative(t)] + [t for t in terms if t.is_number])
        out = ""
        for t in terms:
            coeff, rest = t.as_coeff_Mul()
            if coeff < 0:
                pos = self.doprint(-t)
                out = f"{out} - {pos}" if out else f"-{self._atom(-t)}"
            else:
                s = self.doprint(t)
                out = f"{out} + {s}" if out else s
        return out

    def _mul(self, e: sympy.Mul) -> str:
        coeff, rest = e.as_coeff_Mul()
        factors = sorted(sympy.Mul.make_args(rest), key=sympy.default_sort_key)
        if any(isinstance(f, sympy.Rational) and f.q != 1 for f in sympy.Mul.make_args(e)):
            raise ValueError(f"index expression {e} is not an integer")
        parts = [self._atom(f) for f in factors]
        if coeff == -1:
            return "-" + "*".join(parts)
        if coeff != 1:
            parts.insert(0, self._atom(coeff))
        return "*".join(parts)

    def _pow(self, e: sympy.Pow) -> str:
        base, exp = e.args
        if isinstance(exp, sympy.Integer) and int(exp) > 0:
            return "*".join([self._atom(base)] * int(exp))
        raise ValueError(f"index expression {e} has a non-integer power")


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def python_index(e: sympy.Expr, names: Mapping[sympy.Symbol, str] | None = None) -> str:
    """A plain Python expression (grids, size arguments in the wrapper)."""
    return IndexPrinter(names, triton=False)(e)
