"""The scheduler's and C++ codegen's cached index arithmetic: results depend on every input (a
changed index or variable never returns another call's entry) and equal the uncached sympy math."""

from __future__ import annotations

import sympy

from kiln.inductor.codegen.cpp.kernel import _unit_stride
from kiln.inductor.scheduler.kernels import _linear_coeffs
from kiln.inductor.scheduler.loop_order import _coefficient

x0, x1, r0 = sympy.symbols("x0 x1 r0", integer=True)


def test_coefficient_depends_on_index_and_variable() -> None:
    e = 64 * x0 + x1
    assert _coefficient(e, x0) == 64 and _coefficient(e, x1) == 1
    assert _coefficient(32 * x0 + x1, x0) == 32  # another index, its own entry
    assert _coefficient(x0 * x1, x0) is None  # not a constant stride
    assert _coefficient(e, x0) == sympy.expand(e).coeff(x0)


def test_linear_coeffs_depend_on_all_inputs() -> None:
    assert _linear_coeffs(12 * x0 + 3 * x1 + r0, x0, x1) == (12, 3)
    assert _linear_coeffs(12 * x0 + 3 * x1 + r0, x1, x0) == (3, 12)
    assert _linear_coeffs(12 * x0 + 4 * x1, x0, x1) == (12, 4)
    assert _linear_coeffs(sympy.floor(x0 / 2) + x1, x0, x1) is None


def test_unit_stride() -> None:
    assert _unit_stride(x0 + 8 * r0, x0) and not _unit_stride(x0 + 8 * r0, r0)
    assert _unit_stride(8 * x0 + r0, r0) and not _unit_stride(8 * x0 + r0, x0)
