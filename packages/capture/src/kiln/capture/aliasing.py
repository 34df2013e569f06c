"""Graph input tensors that alias each other: traced as they are, and checked on every call.

A graph is traced for one pattern of aliasing between the tensors a frame reads. Passing the same
tensor twice (``f(x, x)``) gives both parameters one traced tensor, so a write through one is seen
through the other; passing two tensors gives two. Either graph is wrong for the other pattern when it
writes one of them: compiled for ``f(x, x)``, ``f(x, y)`` wrote ``y`` and left ``x`` alone; compiled
for ``f(x, y)``, ``f(x, x)`` read the value from before the write. The same holds between an argument
and a tensor reached another way: a module's buffer the forward updates, called with that buffer as
its argument (``m(m.buf)``), a global tensor, an attribute. So an entry holds only for its own pattern:
the sources that were one tensor are one tensor again, and a tensor the graph writes is no other input
tensor and shares no memory with one.

Two *different* tensors over one memory (``f(x[:6], x[2:])``) with a write to either cannot be traced
as separate inputs (the write would not be seen through the other view): such a call runs in Python,
said in the graph-break log and ``explain()`` (``fullgraph=True`` refuses it).

Parameters and buffers pinned by identity (the entry's guards hold the very objects) keep their
sharing from call to call: two of them are never compared (the flattened weights of an RNN are views
of one memory). Every other input tensor is, when the graph writes a tensor or took one tensor twice;
an entry that writes nothing and took no tensor twice checks nothing. The check runs on the inputs the
entry extracts for its graph (no source is read twice); the storages are compared in kiln.runtime's
native checker when it is installed (~1 us for a 24-layer KV cache's 75 tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kiln.graph import guards_native

from .errors import GraphBreak

Extent = tuple[int, int, int]  # (the memory allocation's address, first byte, one past the last byte read)


def version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or None for an inference tensor (made under ``torch.inference_mode()``, as
    its fake tensors are: they count no writes, so a write to one cannot be told from none)."""
    return None if t.is_inference() else t._version


def byte_span(t: torch.Tensor) -> tuple[int, int] | None:
    """(first byte, one past the last byte) ``t`` can reach from its storage's start; None when it holds no
    elements or a size, stride or offset is symbolic. Strided views that interleave (``a[::2]``,
    ``a[1::2]``) count as overlapping."""
    parts = (t.storage_offset(), *t.shape, *t.stride())
    if not all(type(p) is int for p in parts) or 0 in t.shape:
        return None
    size = t.element_size()
    start = int(t.storage_offset()) * size
    span = sum((int(n) - 1) * abs(int(st)) for n, st in zip(t.shape, t.stride(), strict=True)) + 1
    return start, start + span * size


def _residues(t: torch.Tensor, m: int) -> tuple[int, int] | None:
    """The elements of ``t`` (static layout) as offsets modulo ``m``: (first residue, how many consecutive
    residues they may take), None when they may take every one. Dims whose stride ``m`` divides add
    nothing; the others span ``width`` consecutive element offsets."""
    low, width = int(t.storage_offset()), 1
    for n, st in zip(t.shape, t.stride(), strict=True):
        if n > 1 and st % m:
            width += (n - 1) * abs(st)
            low += (n - 1) * min(st, 0)
    return (low % m, width) if width < m else None


def share_no_element(t: torch.Tensor, u: torch.Tensor) -> bool:
    """Whether two strided views of one storage provably hold no element in common although their byte
    spans meet: modulo some stride ``m``, their elements' offsets lie in disjoint runs (``x[:, :2]`` and
    ``x[:, 2:]`` of a 4x4 ``x``: 0-1 and 2-3 modulo 4; ``a[::2]`` and ``a[1::2]``: 0 and 1 modulo 2).
    False when unsure (symbolic layouts, other element sizes)."""
    parts = (t.storage_offset(), u.storage_offset(), *t.shape, *t.stride(), *u.shape, *u.stride())
    if t.element_size() != u.element_size() or not all(type(p) is int for p in parts):
        return False
    for m in {abs(int(st)) for st in (*t.stride(), *u.stride())} - {0, 1}:
        a, b = _residues(t, m), _residues(u, m)
        if a is not None and b is not None and (b[0] - a[0]) % m >= a[1] and (a[0] - b[0]) % m >= b[1]:
            return True
    return False


def extent(t: torch.Tensor) -> Extent | None:
    """The bytes ``t`` can reach in its memory allocation (None when it holds no elements)."""
    span = byte_span(t)
    return None if span is None else (t.data_ptr() - span[0], *span)


def overlap(extents: list[Extent | None], written: set[int], fixed: int) -> tuple[int, int] | None:
    """A pair (i, j) of tensors whose bytes overlap where one is written and not both are pinned (the
    first ``fixed``), or None."""
    spans = sorted((e, i) for i, e in enumerate(extents) if e is not None)
    active: list[tuple[Extent, int]] = []
    for e, i in spans:
        active = [(f, j) for f, j in active if f[0] == e[0] and f[2] > e[1]]
        for _, j in active:
            if (i in written or j in written) and (i >= fixed or j >= fixed):
                return j, i
        active.append((e, i))
    return None


def written_overlap(values: list, positions: tuple[int, ...], written: tuple[int, ...], fixed: int = 0) -> bool:
    """Whether a written tensor shares memory with another tensor (or is another of them): the tensors
    are ``values[p]`` for ``p`` in ``positions``, ``written`` indexes ``positions``, and the first ``fixed``
    positions are pinned tensors whose sharing among themselves is not asked. In native code when
    kiln.runtime's guard checker is installed."""
    native = guards_native.current()
    if native is not None:
        answer = native.written_overlap(values, positions, written, fixed)
        if answer is not None:
            return bool(answer)
    return written_overlap_python(values, positions, written, fixed)


def written_overlap_python(values: list, positions: tuple[int, ...], written: tuple[int, ...],
                           fixed: int = 0) -> bool:
    """``written_overlap`` without the native checker (and for what it does not read: tensor subclasses)."""
    tensors = [values[p] for p in positions]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return True  # not a tensor where the trace had one: the entry does not hold
    return overlap([extent(t) for t in tensors], set(written), fixed) is not None


class AliasMismatch(Exception):
    """Internal: an entry's inputs alias differently from its trace (raised before the graph runs; the
    frame looks for another entry)."""


@dataclass
class InputTensors:
    """The tracer's record of the tensors it lifted as graph inputs (``Tracer.lift_tensor``)."""

    # id(real tensor) -> (first source, its traced tensor, the traced tensor's version when lifted)
    seen: dict[int, tuple[str, torch.Tensor, int | None]] = field(default_factory=dict)
    same: list[tuple[str, str]] = field(default_factory=list)  # (first source, another source of that tensor)
    extents: dict[str, Extent | None] = field(default_factory=dict)  # first source -> its bytes
    pinned: set[str] = field(default_factory=set)  # sources of tensors pinned by identity

    def fake_of(self, value: torch.Tensor) -> torch.Tensor | None:
        """The traced tensor of ``value`` when it was lifted before (through another source)."""
        first = self.seen.get(id(value))
        return first[1] if first is not None else None

    def lifted(self, value: torch.Tensor, source: str, fake: torch.Tensor, pinned: bool) -> None:
        """``value`` became a graph input read from ``source``; lifted before through another source, it
        is one tensor twice, and the entry requires the same object there again."""
        first = self.seen.get(id(value))
        if first is not None:
            self.same.append((first[0], source))
            return
        self.seen[id(value)] = (source, fake, version(fake))
        if pinned:
            self.pinned.add(source)
        self.extents[source] = extent(value)

    def plan(self) -> AliasPlan | None:
        """What each call must match, after the trace; raises GraphBreak for two tensors over one memory
        one of which the graph writes (unless both are pinned: their sharing does not change)."""
        # an inference tensor counts as written (its writes are not counted)
        written = {src for src, fake, v in self.seen.values() if v is None or fake._version != v}
        firsts = [s for s, _, _ in self.seen.values()]
        pinned = [s for s in firsts if s in self.pinned]
        order = [*pinned, *(s for s in firsts if s not in self.pinned)]
        hit = overlap([self.extents[s] for s in order], {i for i, s in enumerate(order) if s in written}, len(pinned))
        if hit is not None:
            first, second = (order[i] for i in hit)
            raise GraphBreak(f"tensors {first} and {second} share memory and the graph writes "
                             f"{first if first in written else second}: the write would not be seen "
                             "through the other", "pass tensors that do not overlap, or run this call without kiln")
        if not self.same and not written:
            return None
        loose_written = any(s not in self.pinned for s in written)
        # pinned tensors first (``fixed`` of them): all of them when a loose tensor is written (it must
        # not be one of them), else the written ones (they must not be a loose tensor)
        fixed = [s for s in firsts if s in self.pinned and (loose_written or s in written)]
        ordered = (*fixed, *(s for s in firsts if s not in self.pinned))
        return AliasPlan(tuple(self.same), tuple(sorted(written)), ordered, len(fixed))


@dataclass(frozen=True)
class AliasPlan:
    same: tuple[tuple[str, str], ...]  # pairs of sources that must be one tensor
    written: tuple[str, ...]  # input tensors the graph writes
    tensors: tuple[str, ...]  # the input tensors compared (first sources), distinct objects at trace time
    fixed: int  # tensors[:fixed] are pinned: never compared with each other

    def input_check(self, input_sources: list[str]) -> Callable[[list], bool]:
        """``ok(inputs)`` over the graph's inputs as the entry extracts them (every source here is one):
        the pairs are one object, and no written tensor shares memory with another input tensor."""
        at = {s: i for i, s in enumerate(input_sources)}
        same = [(at[a], at[b]) for a, b in self.same]
        positions = tuple(at[s] for s in self.tensors)
        written = tuple(self.tensors.index(s) for s in self.written)
        fixed = self.fixed

        def ok(inputs: list) -> bool:
            for i, j in same:
                if inputs[i] is not inputs[j]:
                    return False
            return not written or not written_overlap(inputs, positions, written, fixed)
        return ok

    def checking(self, extract: Callable[[dict, dict], list], input_sources: list[str]) -> Callable[[dict, dict], list]:
        """``extract`` that raises AliasMismatch when the inputs it read alias differently from the trace:
        checked on the values the graph is about to take, each read once."""
        ok = self.input_check(input_sources)

        def checked(L: dict, G: dict) -> list:
            inputs = extract(L, G)
            if not ok(inputs):
                raise AliasMismatch
            return inputs
        return checked

    def failure(self, L: dict, G: dict) -> str | None:
        """Why a call does not match (for the recompile reason), or None."""
        sources = list(dict.fromkeys([*self.tensors, *(s for pair in self.same for s in pair)]))
        try:
            values = [eval(s, {"L": L, "G": G}) for s in sources]  # noqa: S307 (sources the tracer wrote)
        except Exception:  # noqa: BLE001 - a source that no longer resolves
            return "an input tensor's source no longer resolves"
        if self.input_check(sources)(values):
            return None
        return (f"input tensors alias differently from the trace (traced: "
                f"{', '.join(f'{a} is {b}' for a, b in self.same) or 'no tensor read twice'}; "
                f"written: {', '.join(self.written) or 'none'})")
