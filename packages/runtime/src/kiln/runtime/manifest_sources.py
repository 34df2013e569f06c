"""Schema 3 of the manifest: sources as a read tree, inputs and guards as rows.

A module's artifact names ~800 sources (its parameters' inputs, guards on module attributes), each a
chain like ``L['self']._modules['features']._modules['3'].stride`` repeating the same prefixes.
Schema 3 writes each distinct source and prefix once, as a row ``[parent row or -1, segment]``
(``kiln.graph.source_tree``: the rows the guard plan reads through), and inputs and guards name a
row:

    "sources": [[-1, "L['self']"], [0, "._modules"], [1, "['features']"], ...]
    "inputs":  [[row, name or null, spec], ...]      spec: [dtype, device, shape, stride, requires_grad]
    "guards":  [[row or -1, kind, expected, note], ...]   note: an index into "notes"
    "notes":   ["", "torchvision/models/mobilenetv3.py:113", ...]
    "plan":    the loaded function's guard plan (``GuardSet.gather_layout``: reads level by level,
               guards by index), so a load that reads every source as saved (no external data or
               constants rebinding a prefix) builds its check without analysing ~800 guards again

An input's name is null when it is the source's display name (``self._modules['features']...``),
rebuilt from the tree. The reader returns the same InputRecords and guards as schemas 1-2 and the
tree itself, which the loaded function's guard plan takes (no source splitting at load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

from kiln.graph import (
    GUARD_KINDS,
    Guard,
    GuardSet,
    TensorSpec,
    expected_from_json,
    expected_to_json,
    source_tree,
)

from . import manifest as _manifest  # a cycle: manifest imports this module; used at call time only
from .sources import display_name


def compact_sources(inputs: Sequence[Any], guards: GuardSet) -> dict[str, Any]:
    """The schema-3 ``sources``, ``inputs``, ``guards`` and ``notes`` entries of a manifest."""
    spec_to_json = _manifest.spec_to_json
    stored = [g for g in guards.guards if g.portable]
    tree = source_tree([*(i.source for i in inputs), *(g.source for g in stored)])
    row = {source: i for i, (source, _, _) in enumerate(tree)}
    names = _Names(tree)
    notes: dict[str, int] = {"": 0}
    # the loaded function's guard plan, for the guards in the order a load rebuilds them
    loaded_guards = _manifest._with_spec_guards(GuardSet(tuple(stored)), tuple(inputs))
    layout = loaded_guards.gather_layout([i.source for i in inputs], tree)
    return {
        "plan": layout,
        "sources": [[parent, segment] for _, parent, segment in tree],
        "inputs": [[row[i.source], None if names.of(row[i.source]) == i.name else i.name,
                    _spec_row(spec_to_json(i.spec))] for i in inputs],
        "guards": [[row[g.source] if g.source else -1, g.kind, expected_to_json(g.expected),
                    notes.setdefault(g.note, len(notes))] for g in stored],
        "notes": list(notes),
    }


def read_sources(d: Mapping[str, Any]) -> tuple[tuple[tuple[str, int, str], ...], Sequence[Any], GuardSet]:
    """(tree, inputs, guards) of a schema-3 manifest; the guards include the TENSOR_MATCH guards
    schema 2 leaves to the input specs. Malformed rows raise KeyError, TypeError, ValueError or
    IndexError (the caller's "malformed manifest" error). Written for a new process's load (C-level
    loops where it can: ~1,300 sources, ~800 guards and ~270 inputs for a mobilenet)."""
    rows = d["sources"]
    sources: list[str] = []
    append = sources.append
    for parent, segment in rows:  # a parent after its row: IndexError
        append(segment if parent < 0 else sources[parent] + segment)
    if not _STR.issuperset(map(type, sources)):
        raise ValueError("a source row's segment is not a string")
    tree = cast(tuple[tuple[str, int, str], ...], tuple(zip(sources, *zip(*rows))) if rows else ())
    notes = d["notes"]
    # records, not Guards: the check is built from them (GuardSet.compile_layout); Guards are made
    # when something else needs them (an error, as_text, a re-save)
    records = [GuardRecord(sources[i] if i >= 0 else "", kind, expected_from_json(expected), notes[note])
               for i, kind, expected, note in d["guards"]]
    if not _KINDS.issuperset(r.kind for r in records):
        raise ValueError(f"unknown guard kind in {sorted({r.kind for r in records} - _KINDS)}")
    input_rows = d["inputs"]
    inputs = LazyInputs(input_rows, sources, tree)
    matched = {r.source for r in records if r.kind == "TENSOR_MATCH"}
    for source, (_, _, row) in zip(inputs.sources, input_rows):
        if type(row) is list and source not in matched:  # a tensor's spec: as Manifest._with_spec_guards
            records.append(GuardRecord(source, "TENSOR_MATCH", _expectation(row), ""))
            matched.add(source)
    return tree, inputs, GuardSet(LazyGuards(records))  # type: ignore[arg-type]


class GuardRecord(NamedTuple):
    """A guard as read, before it is a Guard (what the guard plan reads of one)."""

    source: str
    kind: str
    expected: Any
    note: str


class _LazyTuple(Sequence):
    """A tuple made on first use (``_all``): indexing, iteration, equality with tuples, hashing."""

    def _all(self) -> tuple:
        raise NotImplementedError

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self) -> Any:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return self._all() == (tuple(other) if isinstance(other, (tuple, _LazyTuple)) else other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


class LazyGuards(_LazyTuple):
    """A schema-3 manifest's Guards, made on first use; ``records`` are what a load builds its
    check from (~840 Guards for a mobilenet: ~0.4 ms of a new process's load)."""

    def __init__(self, records: list[GuardRecord]) -> None:
        self.records = records
        self._items: tuple[Guard, ...] | None = None

    def _all(self) -> tuple[Guard, ...]:
        if self._items is None:
            self._items = tuple(Guard(*r) for r in self.records)
        return self._items

    def __len__(self) -> int:
        return len(self.records)


class LazyInputs(_LazyTuple):
    """A schema-3 manifest's InputRecords, made on first use: a load needs only their sources (and
    each tensor's TENSOR_MATCH expectation, made from its row); names and TensorSpecs serve errors,
    ``as_text`` and re-saving (~270 of each for a mobilenet, ~0.8 ms of a new process's load)."""

    def __init__(self, rows: list, sources: list[str], tree: Sequence[tuple[str, int, str]]) -> None:
        for row in rows:
            if len(row) != 3:
                raise ValueError("an input row is not [source row, name, spec]")
        self.sources: tuple[str, ...] = tuple(map(sources.__getitem__, [r[0] for r in rows]))
        self._rows, self._tree = rows, tree
        self._items: tuple | None = None

    def _all(self) -> tuple:
        if self._items is None:
            names = _Names(self._tree)
            self._items = tuple(
                _manifest.InputRecord(name if name is not None else names.of(i), source, _spec_from_row(row))
                for source, (i, name, row) in zip(self.sources, self._rows))
        return self._items

    def __len__(self) -> int:
        return len(self._rows)


_STR = frozenset({str})
_KINDS = frozenset(GUARD_KINDS)
_INT = frozenset({int})


class _Names:
    """Display names of tree rows: a root's ``display_name``, then its children's segments appended
    (``display_name`` rewrites only a source's root)."""

    def __init__(self, tree: Sequence[tuple[str, int, str]]) -> None:
        self.tree = tree
        self.memo: dict[int, str] = {}

    def of(self, i: int) -> str:
        got = self.memo.get(i)
        if got is None:
            source, parent, segment = self.tree[i]
            got = display_name(source) if parent < 0 else self.of(parent) + segment
            self.memo[i] = got
        return got


def _spec_row(spec: object) -> object:
    """A spec_to_json dict as a row (ints and None as they are)."""
    if not isinstance(spec, dict):
        return spec
    return [spec["dtype"], spec["device"], spec["shape"], spec["stride"], spec["requires_grad"]]


def _spec_from_row(row: object) -> TensorSpec | int | None:
    if type(row) is not list:
        return _manifest.spec_from_json(row)
    dtype, device, shape, stride, requires_grad = row
    return _manifest.spec_from_parts(dtype, device, shape, stride, requires_grad)


def _expectation(row: list) -> tuple:
    """The TENSOR_MATCH expectation of a tensor input's spec row, as ``spec_expectation`` gives it."""
    dtype, device, shape, stride, requires_grad = row
    if _INT.issuperset(map(type, shape)) and _INT.issuperset(map(type, stride)):
        # without a TensorSpec, nor str() of a dtype and a device object
        return ("torch." + dtype, device, tuple(shape), tuple(stride), bool(requires_grad))
    return _manifest.spec_expectation(_spec_from_row(row))  # type: ignore[arg-type]
