"""ShapeEnv size expressions whose symbolic divisor cancels (``h**2 // (2*h)``) become kiln index
expressions without a division by a symbol: kiln.inductor refused such a divisor, which it cannot
prove positive (ConvNeXt with dynamic=True then ran its ATen graph op by op)."""

from __future__ import annotations

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv as TorchFloorDiv
from torch.utils._sympy.functions import PythonMod

from kiln.inductor.ir.index import DynamicShapeUnsupported, FloorDiv, size_symbol, to_kiln

s, t = sympy.symbols("s53 s2", integer=True, positive=True)
h = TorchFloorDiv(s, 4)


def _value(e: sympy.Expr, **sizes: int) -> int:
    return int(e.subs({size_symbol(k): v for k, v in sizes.items()}))


@pytest.mark.parametrize("expr, python", [
    (TorchFloorDiv(h ** 2, h), lambda S, T: (S // 4) ** 2 // (S // 4)),
    (TorchFloorDiv(h ** 2, 2 * h), lambda S, T: (S // 4) ** 2 // (2 * (S // 4))),
    (TorchFloorDiv(6 * s * t, 4 * t), lambda S, T: 6 * S * T // (4 * T)),
    (PythonMod(3 * s * t, t), lambda S, T: 3 * S * T % T),
])
def test_a_cancelling_divisor_leaves_no_symbolic_division(expr, python) -> None:
    got = to_kiln(expr)
    divisors = [a.args[1] for a in got.atoms(FloorDiv)]
    assert all(d.is_Integer for d in divisors), got
    for S in (4, 5, 7, 8, 31, 64, 224):
        for T in (1, 3, 16):
            assert _value(got, s53=S, s2=T) == python(S, T), (S, T, got)


def test_a_divisor_that_does_not_cancel_is_still_refused() -> None:
    with pytest.raises(DynamicShapeUnsupported, match="cannot prove positive"):
        to_kiln(TorchFloorDiv(s + 1, h))


def test_a_size_symbol_of_range_one_and_up_is_a_positive_divisor() -> None:
    """``torch.roll`` over a symbolic dim normalises its shift as ``shift % s``: a divisor kiln.inductor
    refused (its size symbols are only known non-negative) until the compile takes the ShapeEnv's
    ranges, where the capture's guards keep every size symbol at >= 1 (0 specialises)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._sympy.value_ranges import ValueRanges

    from kiln.inductor.ir.index import positive_sizes

    n = sympy.Symbol("s9", integer=True, nonnegative=True)  # no positive assumption of its own
    expr = PythonMod(TorchFloorDiv(n, 3), n)
    with pytest.raises(DynamicShapeUnsupported, match="cannot prove positive"):
        to_kiln(expr)
    env = ShapeEnv()
    env.var_to_range[n] = ValueRanges(1, sympy.oo)
    with positive_sizes(env):
        got = to_kiln(expr)
        for S in (1, 2, 3, 7, 64):
            assert _value(got, s9=S) == (S // 3) % S, (S, got)
    env.var_to_range[n] = ValueRanges(0, sympy.oo)  # a range that holds 0, no example size: no claim
    with positive_sizes(env), pytest.raises(DynamicShapeUnsupported):
        to_kiln(expr)


def test_a_divisor_positive_at_the_example_becomes_a_size_guard() -> None:
    """``x // (s // 4)``: positive at the example (s = 8), so the compile assumes ``s // 4 >= 1`` as a
    guard of the ShapeEnv (checked per call); at an example where it is 0 (s = 2) it is refused and no
    guard is recorded."""
    # tests only: a source for the ShapeEnv's symbol
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from kiln.inductor.ir.index import positive_sizes

    for example, ok in ((8, True), (2, False)):
        env = ShapeEnv()
        sym = env.create_symbol(example, ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC)
        expr = TorchFloorDiv(sym + 1, TorchFloorDiv(sym, 4))
        with positive_sizes(env):
            if ok:
                got = to_kiln(expr)
                assert _value(got, **{sym.name: example}) == (example + 1) // (example // 4), got
                assert [g.expr for g in env.guards] == [sympy.Ge(TorchFloorDiv(sym, 4), 1)], env.guards
            else:
                with pytest.raises(DynamicShapeUnsupported):
                    to_kiln(expr)
                assert not env.guards
