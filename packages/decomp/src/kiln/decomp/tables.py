"""The table registry: which family modules feed which table (the one place that decides).

``core_aten``: every kiln rule registered for ``core_aten``; applied to a fixpoint it leaves only ops
in ``kiln.graph.CORE_ATEN_OPS``. ``inductor``: core plus the performance rewrites registered for
``inductor`` (they win over core rules for the same op). ``prims``: core plus the rules that map core
ATen to ``kiln_prims``. User rules (``kiln.decomp.register``) are merged last into the table they name.
"""

from __future__ import annotations

from . import (
    activations,
    creation,
    elementwise,
    indexing,
    inductor_rewrites,
    linalg,
    losses,
    norms,
    padding,
    pooling,
    random_ops,
    reductions,
    shape_ops,
    softmax,
    to_prims,
    to_prims_views,
    upsample,
)
from .registry import TABLE_DIALECTS, TABLE_NAMES, USER, Decomposition, DecompTable, Family

FAMILIES: tuple[Family, ...] = (
    activations.FAMILY,
    creation.FAMILY,
    elementwise.FAMILY,
    indexing.FAMILY,
    inductor_rewrites.FAMILY,
    linalg.FAMILY,
    losses.FAMILY,
    norms.FAMILY,
    padding.FAMILY,
    pooling.FAMILY,
    random_ops.FAMILY,
    reductions.FAMILY,
    shape_ops.FAMILY,
    softmax.FAMILY,
    upsample.FAMILY,
    to_prims.FAMILY,
    to_prims_views.FAMILY,
)

# Which registered tables feed each table, in override order (later wins).
_SOURCES: dict[str, tuple[str, ...]] = {
    "core_aten": ("core_aten",),
    "inductor": ("core_aten", "inductor"),
    "prims": ("core_aten", "prims"),
}

_cache: dict[tuple[str, int], DecompTable] = {}


def all_entries() -> list[Decomposition]:
    """Every registered rule, kiln's families first, then the user's."""
    return [e for fam in (*FAMILIES, USER) for e in fam.entries]


def table(name: str) -> DecompTable:
    """The decomposition table ``name`` (one of ``core_aten``, ``inductor``, ``prims``)."""
    if name not in TABLE_NAMES:
        raise KeyError(f"unknown decomposition table {name!r}; known: {', '.join(TABLE_NAMES)}")
    key = (name, len(USER.entries))  # a user registration invalidates the cached tables
    cached = _cache.get(key)
    if cached is not None:
        return cached
    sources = _SOURCES[name]
    entries = [e for src in sources for e in all_entries() if e.table == src]
    entries.sort(key=lambda e: (sources.index(e.table), e.family == "user"))
    built = DecompTable(name, entries, TABLE_DIALECTS[name])
    _cache[key] = built
    return built
