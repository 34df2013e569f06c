"""ShapeEnv divisions whose dividend may be negative (a convolution's output size divides ``H - 1``) in
kiln's vocabulary: shifted to a non-negative dividend, so C's truncating ``/`` and ``%`` give Python's
floor results at every size; a dividend with no lower bound is refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sympy
from torch.utils._sympy.functions import CeilDiv, FloorDiv, ModularIndexing, PythonMod

from kiln.inductor.ir.index import DynamicShapeUnsupported, size_symbol, to_kiln

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)
SIZES = range(0, 40)


@pytest.mark.parametrize(("torch_expr", "python"), [
    (FloorDiv(S0 - 1, 2) + 1, lambda s: (s - 1) // 2 + 1),  # conv k=7 s=2 p=3; max pool k=3 s=2 p=1
    (FloorDiv(S0 - 3, 4), lambda s: (s - 3) // 4),
    (CeilDiv(S0 - 5, 3), lambda s: -((5 - s) // 3)),
    (PythonMod(S0 - 3, 4), lambda s: (s - 3) % 4),
    (ModularIndexing(S0 - 7, 2, 3), lambda s: ((s - 7) // 2) % 3),
])
def test_negative_dividends_are_shifted_and_exact(torch_expr: sympy.Expr, python: Callable[[int], int]) -> None:
    kiln_expr = to_kiln(torch_expr)
    s0 = size_symbol("s0")
    divisions = [n for n in sympy.preorder_traversal(kiln_expr) if type(n).__name__ in ("FloorDiv", "ModIndex")]
    assert divisions, kiln_expr
    for s in SIZES:
        for n in divisions:  # C's / and % see a non-negative dividend at every size
            assert int(n.args[0].subs(s0, s)) >= 0, (kiln_expr, n, s)
        assert int(kiln_expr.subs(s0, s)) == python(s), (kiln_expr, s)


def test_a_dividend_without_a_lower_bound_is_refused() -> None:
    with pytest.raises(DynamicShapeUnsupported, match="cannot prove non-negative"):
        to_kiln(FloorDiv(S0 - S1, 2))
