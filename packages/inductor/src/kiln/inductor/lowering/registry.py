"""The lowering registry: ATen op name -> rule, merged from one module per op family."""

from __future__ import annotations

from . import (
    collectives,
    composite,
    extern,
    foreach,
    indexing,
    pointwise,
    pooling,
    random,
    reductions,
    scan,
    views,
)
from .common import Rule

LOWERINGS: dict[str, Rule] = {
    **pointwise.RULES,
    **views.RULES,
    **reductions.RULES,
    **composite.RULES,
    **foreach.RULES,
    **indexing.RULES,
    **pooling.RULES,
    **scan.RULES,
    **random.RULES,
    **extern.RULES,
    **collectives.RULES,
}


# ops whose rules take symbolic float scalars (ir/scalars.py); others given one run through ATen
TAKES_SYMBOLIC_FLOATS: frozenset[str] = pointwise.SYMBOLIC_FLOAT_OPS


def lowered_ops() -> list[str]:
    return sorted(LOWERINGS)
