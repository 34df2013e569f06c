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

An input's name is null when it is the source's display name (``self._modules['features']...``),
rebuilt from the tree. The reader returns the same InputRecords and guards as schemas 1-2 and the
tree itself, which the loaded function's guard plan takes (no source splitting at load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.graph import Guard, GuardSet, TensorSpec, expected_from_json, expected_to_json, source_tree

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
    return {
        "sources": [[parent, segment] for _, parent, segment in tree],
        "inputs": [[row[i.source], None if names.of(row[i.source]) == i.name else i.name,
                    _spec_row(spec_to_json(i.spec))] for i in inputs],
        "guards": [[row[g.source] if g.source else -1, g.kind, expected_to_json(g.expected),
                    notes.setdefault(g.note, len(notes))] for g in stored],
        "notes": list(notes),
    }


def read_sources(d: Mapping[str, Any]) -> tuple[tuple[tuple[str, int, str], ...], tuple, GuardSet]:
    """(tree, inputs, guards) of a schema-3 manifest; the guards include the TENSOR_MATCH guards
    schema 2 leaves to the input specs. Malformed rows raise KeyError, TypeError, ValueError or
    IndexError (the caller's "malformed manifest" error). Written for a new process's load (C-level
    loops where it can: ~1,300 sources, ~800 guards and ~270 inputs for a mobilenet)."""
    InputRecord, spec_expectation = _manifest.InputRecord, _manifest.spec_expectation
    rows = d["sources"]
    sources: list[str] = []
    append = sources.append
    for parent, segment in rows:  # a parent after its row: IndexError
        append(segment if parent < 0 else sources[parent] + segment)
    if not _STR.issuperset(map(type, sources)):
        raise ValueError("a source row's segment is not a string")
    tree = tuple(zip(sources, *zip(*rows))) if rows else ()
    names = _Names(tree)
    notes = d["notes"]
    guards = [Guard(sources[i] if i >= 0 else "", kind, expected_from_json(expected), notes[note])
              for i, kind, expected, note in d["guards"]]
    matched = {g.source for g in guards if g.kind == "TENSOR_MATCH"}
    inputs = []
    spec_guards = []
    for i, name, row in d["inputs"]:
        source = sources[i]
        spec, expectation = _spec_from_row(row)
        inputs.append(InputRecord(name if name is not None else names.of(i), source, spec))
        if type(spec) is TensorSpec and source not in matched:  # as Manifest._with_spec_guards
            spec_guards.append(Guard(source, "TENSOR_MATCH", expectation or spec_expectation(spec)))
            matched.add(source)
    return tree, tuple(inputs), GuardSet((*guards, *spec_guards))


_STR = frozenset({str})
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


def _spec_from_row(row: object) -> tuple[TensorSpec | int | None, tuple | None]:
    """(spec, its TENSOR_MATCH expectation or None to compute) of an input row's spec."""
    if type(row) is not list:
        return _manifest.spec_from_json(row), None
    dtype, device, shape, stride, requires_grad = row
    spec = _manifest.spec_from_parts(dtype, device, shape, stride, requires_grad)
    if not (_INT.issuperset(map(type, shape)) and _INT.issuperset(map(type, stride))):
        return spec, None  # symbolic sizes: spec_expectation frees them
    # what spec_expectation gives, without str() of the dtype and device objects
    return spec, ("torch." + dtype, device, tuple(shape), tuple(stride), bool(requires_grad))
