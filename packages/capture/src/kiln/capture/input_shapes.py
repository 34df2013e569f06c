"""Guards on a symbolic input's layout and declared ranges, made when the tracer lifts the tensor
(tracer.py ``lift_tensor``): its strides as bound names or relations, ``mark_dynamic``'s min/max."""

from __future__ import annotations

from typing import Any

import sympy
import torch

from kiln.graph import Guard, py_expr

from .errors import Unsupported
from .shape_guards import STRIDE_NOTE


def guard_strides(fake: torch.Tensor, source: str, symbol_sources: dict[str, list[str]],
                  stride_relations: list[Guard]) -> tuple[int | None, ...]:
    """The strides of a tensor with symbolic sizes, guarded: the trace and its kernels assume the
    fake tensor's stride expressions, so a call's stride must equal each one. A number is pinned
    in TENSOR_MATCH (returned), a symbol is bound like a size (``symbol_sources``), an expression
    (``64*s1``) is a relation over a bound name (``stride_relations``); a call with another layout
    recompiles."""
    pinned: list[int | None] = []
    for i, st in enumerate(fake.stride()):
        expr = st.node.expr if isinstance(st, torch.SymInt) else sympy.Integer(st)
        if expr.is_number:
            pinned.append(int(expr))
            continue
        pinned.append(None)
        where = f"{source}.stride()[{i}]"
        if isinstance(expr, sympy.Symbol):
            symbol_sources.setdefault(str(expr), []).append(where)
            continue
        name = f"stride{len(stride_relations)}"
        symbol_sources.setdefault(name, []).append(where)
        stride_relations.append(Guard("", "SHAPE_EXPR", f"{name} == {py_expr(expr)}", STRIDE_NOTE))
    return tuple(pinned)


def constrain_ranges(shape_env: Any, value: torch.Tensor, fake: torch.Tensor, source: str) -> None:
    """``mark_dynamic(t, dim, min=, max=)``: the symbol's range (guarded as ``s0 >= min``, ``s0 <= max``)."""
    assert shape_env is not None
    for d, (lo, hi) in getattr(value, "_kiln_dynamic_ranges", {}).items():
        size = int(value.shape[d])
        if (lo is not None and size < lo) or (hi is not None and size > hi):
            raise Unsupported(f"{source}.size()[{d}] is {size}, outside the range [{lo}, {hi}] given to "
                              "mark_dynamic; widen the range or call with a size inside it")
        s = fake.shape[d]
        if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
            vr = shape_env.var_to_range[s.node.expr]
            shape_env.constrain_symbol_range(
                s.node.expr, compiler_min=int(vr.lower) if lo is None else max(lo, int(vr.lower)),
                compiler_max=vr.upper if hi is None else hi)
