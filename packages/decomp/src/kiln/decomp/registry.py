"""Decomposition registries: families of decompositions, and the read-only tables built from them.

Note: registration is explicit. Each family module (activations.py, norms.py, ...) owns one
``Family`` and fills it with ``@FAMILY.register(op, table=...)`` at definition time; ``tables.py``
imports the family modules by name and builds the tables from them, so there is exactly one place that
decides what a table contains. Users add their own entries with ``kiln.decomp.register``, which fills
the ``USER`` family (merged last, so a user entry overrides kiln's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload, OpOverloadPacket

from kiln.graph import Dialect

DecompFn = Callable[..., Any]
TABLE_NAMES: tuple[str, ...] = ("core_aten", "inductor", "prims")
# The dialect each table's output satisfies once decompose() reaches its fixpoint.
TABLE_DIALECTS: dict[str, Dialect] = {
    "core_aten": Dialect.CORE_ATEN,
    "inductor": Dialect.CORE_ATEN,
    "prims": Dialect.PRIMS,
}

OpLike = OpOverload | OpOverloadPacket | str


@dataclass(frozen=True, slots=True)
class Decomposition:
    """One registered rule: ``fn`` computes ``op`` with other ops and is put in ``table``."""

    op: OpOverload
    fn: DecompFn
    table: str
    family: str


def op_name(op: OpOverload) -> str:
    """``aten.gelu.default``: the name CORE_ATEN_OPS and the CLI use."""
    return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname}"


def resolve_ops(op: OpLike) -> list[OpOverload]:
    """An overload, every overload of a packet, or a name ``aten.gelu[.default]`` -> overloads."""
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, str):
        parts = op.split(".")
        if len(parts) not in (2, 3):
            raise ValueError(f"operator name {op!r} must look like 'aten.gelu' or 'aten.gelu.default'")
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        if len(parts) == 3:
            return [getattr(packet, parts[2])]
        op = packet
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    raise TypeError(f"expected an OpOverload, OpOverloadPacket or operator name, got {op!r}")


class Family:
    """The decompositions of one family of ops, in registration order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: list[Decomposition] = []

    def register(self, *ops: OpLike, table: str = "core_aten") -> Callable[[DecompFn], DecompFn]:
        if table not in TABLE_NAMES:
            raise ValueError(f"unknown decomposition table {table!r}; known: {', '.join(TABLE_NAMES)}")

        def add(fn: DecompFn) -> DecompFn:
            for op in ops:
                for overload in resolve_ops(op):
                    self.entries.append(Decomposition(overload, fn, table, self.name))
            return fn

        return add


class DecompTable(Mapping[OpOverload, DecompFn]):
    """A read-only ``OpOverload -> decomposition`` mapping with a name and a target dialect.

    ``dialect`` is what ``decompose(gm, table)`` output satisfies at its fixpoint; ``None`` for a
    partial table (``select``), whose output is only guaranteed to be ATen.
    """

    __slots__ = ("_fns", "_sources", "dialect", "name")

    def __init__(self, name: str, entries: Iterable[Decomposition], dialect: Dialect | None) -> None:
        self.name = name
        self.dialect = dialect
        self._fns: dict[OpOverload, DecompFn] = {}
        self._sources: dict[OpOverload, Decomposition] = {}
        for e in entries:
            self._fns[e.op] = e.fn
            self._sources[e.op] = e

    def __getitem__(self, op: OpOverload) -> DecompFn:
        return self._fns[op]

    def __iter__(self) -> Iterator[OpOverload]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def __contains__(self, op: object) -> bool:
        return op in self._fns

    def entry(self, op: OpOverload) -> Decomposition:
        """Where the rule for ``op`` came from (family, table)."""
        return self._sources[op]

    def entries(self) -> list[Decomposition]:
        return list(self._sources.values())

    def names(self) -> list[str]:
        return sorted(op_name(op) for op in self._fns)

    def __repr__(self) -> str:
        return f"DecompTable({self.name!r}, {len(self)} ops, dialect={self.dialect})"


def select(ops: Iterable[OpLike], table: DecompTable | Mapping[OpOverload, DecompFn]) -> DecompTable:
    """The sub-table of ``table`` for ``ops`` (overloads, packets or names); unknown ops are an error."""
    chosen: list[Decomposition] = []
    missing: list[str] = []
    for op in ops:
        found = [o for o in resolve_ops(op) if o in table]
        if not found:
            missing.append(op if isinstance(op, str) else str(op))
        for o in found:
            if isinstance(table, DecompTable):
                chosen.append(table.entry(o))
            else:
                chosen.append(Decomposition(o, table[o], "core_aten", "selected"))
    if missing:
        raise KeyError(
            f"no decomposition for {', '.join(missing)} in {getattr(table, 'name', 'the table')}; "
            "list what exists with `kiln-decomp list`"
        )
    name = f"select({getattr(table, 'name', 'table')})"
    return DecompTable(name, chosen, None)


USER = Family("user")


def register(*ops: OpLike, table: str = "core_aten") -> Callable[[DecompFn], DecompFn]:
    """Register a user decomposition of ``ops`` into ``table`` (overrides kiln's own rule).

    The function receives the op's arguments as the dispatcher passes them (schema names, kwarg-only
    arguments as keywords) and must compute the result with ``torch.ops.aten`` calls; it may return
    ``NotImplemented`` to leave the op in place for these arguments.
    """
    return USER.register(*ops, table=table)
