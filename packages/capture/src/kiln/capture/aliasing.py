"""Tensor arguments that alias each other: traced as they are, and checked on every call.

A graph is traced for one pattern of aliasing between the tensors a frame receives. Passing the same
tensor twice (``f(x, x)``) gives both parameters one traced tensor, so a write through one is seen
through the other; passing two tensors gives two. Either graph is wrong for the other pattern when it
writes one of them: compiled for ``f(x, x)``, ``f(x, y)`` wrote ``y`` and left ``x`` alone; compiled
for ``f(x, y)``, ``f(x, x)`` read the value from before the write. So an entry holds only for its own
pattern: the sources that were one tensor are one tensor again, and a tensor the graph writes is
neither another argument nor a view of another argument's memory.

Two *different* tensors over one memory (``f(x[:6], x[2:])``) with a write to either cannot be traced
as separate inputs (the write would not be seen through the other view): such a call runs in Python,
said in the graph-break log and ``explain()`` (``fullgraph=True`` refuses it).

Only tensors reached through the frame's arguments are checked (not a module's ``self`` state, which
the entry pins by identity, nor an optimizer's state), and only by entries that write an argument or
took one tensor twice. The check runs on the inputs the entry extracts for its graph (no source is read
twice); a written argument's storage is compared with the others' in kiln.runtime's native checker when
it is installed (~1 us for a 24-layer KV cache's 75 tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kiln.graph import guards_native

from .errors import GraphBreak


def argument_source(source: str) -> bool:
    """Whether ``source`` reaches its tensor through a frame argument other than ``self``."""
    return source.startswith("L[") and not source.startswith("L['self']")


def storage_key(t: torch.Tensor) -> int:
    """The address of ``t``'s memory allocation (0 when it holds no elements)."""
    return t.data_ptr() - int(t.storage_offset()) * t.element_size() if t.numel() else 0


def written_overlap(values: list, positions: tuple[int, ...], written: tuple[int, ...]) -> bool:
    """Whether a written tensor shares its memory with another tensor (or is another of them): the
    tensors are ``values[p]`` for ``p`` in ``positions``, ``written`` indexes ``positions``. In native code
    when kiln.runtime's guard checker is installed."""
    native = guards_native.current()
    if native is not None:
        answer = native.written_overlap(values, positions, written)
        if answer is not None:
            return bool(answer)
    return written_overlap_python(values, positions, written)


def written_overlap_python(values: list, positions: tuple[int, ...], written: tuple[int, ...]) -> bool:
    """``written_overlap`` without the native checker (and for what it does not read: tensor subclasses)."""
    tensors = [values[p] for p in positions]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return True  # not a tensor where the trace had one: the entry does not hold
    keys = [storage_key(t) for t in tensors]
    return any(keys[w] and keys.count(keys[w]) > 1 for w in written)


class AliasMismatch(Exception):
    """Internal: an entry's inputs alias differently from its trace (raised before the graph runs; the
    frame looks for another entry)."""


@dataclass
class ArgumentTensors:
    """The tracer's record of the argument tensors it lifted (``Tracer.lift_tensor``)."""

    # id(real tensor) -> (first source, its traced tensor, the traced tensor's version when lifted)
    seen: dict[int, tuple[str, torch.Tensor, int]] = field(default_factory=dict)
    same: list[tuple[str, str]] = field(default_factory=list)  # (first source, another source of that tensor)
    storages: dict[int, list[str]] = field(default_factory=dict)  # storage_key -> first sources sharing it

    def lifted(self, value: torch.Tensor, source: str, fake: torch.Tensor) -> None:
        """``value`` became a graph input read from ``source``; lifted before through another source, it
        is one tensor twice, and the entry requires the same object there again."""
        if not argument_source(source):
            return
        first = self.seen.get(id(value))
        if first is not None:
            self.same.append((first[0], source))
            return
        self.seen[id(value)] = (source, fake, fake._version)
        key = storage_key(value)
        if key:
            self.storages.setdefault(key, []).append(source)

    def plan(self) -> AliasPlan | None:
        """What each call must match, after the trace; raises GraphBreak for two tensors over one memory
        one of which the graph writes."""
        written = {src for src, fake, version in self.seen.values() if fake._version != version}
        for sources in self.storages.values():
            hit = [s for s in sources if s in written]
            if len(sources) > 1 and hit:
                other = next(s for s in sources if s != hit[0])
                raise GraphBreak(f"tensor arguments {hit[0]} and {other} share memory and the graph writes "
                                 f"{hit[0]}: the write would not be seen through the other",
                                 "pass tensors that do not overlap, or run this call without kiln")
        if not self.same and not written:
            return None
        return AliasPlan(tuple(self.same), tuple(sorted(written)), tuple(s for s, _, _ in self.seen.values()))


@dataclass(frozen=True)
class AliasPlan:
    same: tuple[tuple[str, str], ...]  # pairs of sources that must be one tensor
    written: tuple[str, ...]  # argument tensors the graph writes
    arguments: tuple[str, ...]  # every argument tensor (first sources), distinct objects at trace time

    def input_check(self, input_sources: list[str]) -> Callable[[list], bool]:
        """``ok(inputs)`` over the graph's inputs as the entry extracts them (every source here is one):
        the pairs are one object, and no written tensor shares memory with another argument tensor."""
        at = {s: i for i, s in enumerate(input_sources)}
        same = [(at[a], at[b]) for a, b in self.same]
        args = tuple(at[s] for s in self.arguments)
        written = tuple(self.arguments.index(s) for s in self.written)

        def ok(inputs: list) -> bool:
            for i, j in same:
                if inputs[i] is not inputs[j]:
                    return False
            return not written or not written_overlap(inputs, args, written)
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
        sources = list(dict.fromkeys([*self.arguments, *(s for pair in self.same for s in pair)]))
        try:
            values = [eval(s, {"L": L, "G": G}) for s in sources]  # noqa: S307 (sources the tracer wrote)
        except Exception:  # noqa: BLE001 - a source that no longer resolves
            return "a tensor argument's source no longer resolves"
        if self.input_check(sources)(values):
            return None
        return (f"tensor arguments alias differently from the trace (traced: "
                f"{', '.join(f'{a} is {b}' for a, b in self.same) or 'no argument passed twice'}; "
                f"written: {', '.join(self.written) or 'none'})")
