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
the entry pins by identity, nor an optimizer's state): a checked tensor costs one source read per call,
and only entries that write an argument or took one tensor twice check at all.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .errors import GraphBreak


def argument_source(source: str) -> bool:
    """Whether ``source`` reaches its tensor through a frame argument other than ``self``."""
    return source.startswith("L[") and not source.startswith("L['self']")


def storage_key(t: torch.Tensor) -> int:
    """The address of ``t``'s memory allocation (0 when it holds no bytes)."""
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() else 0


@dataclass
class ArgumentTensors:
    """The tracer's record of the argument tensors it lifted (``Tracer.lift_tensor``)."""

    # id(real tensor) -> (first source, its traced tensor, the traced tensor's version when lifted)
    seen: dict[int, tuple[str, torch.Tensor, int]] = field(default_factory=dict)
    same: list[tuple[str, str]] = field(default_factory=list)  # (first source, another source of that tensor)
    storages: dict[int, list[str]] = field(default_factory=dict)  # storage_key -> first sources sharing it

    def lifted(self, value: torch.Tensor, source: str, fake: torch.Tensor) -> None:
        if not argument_source(source) or id(value) in self.seen:
            return
        self.seen[id(value)] = (source, fake, fake._version)
        key = storage_key(value)
        if key:
            self.storages.setdefault(key, []).append(source)

    def again(self, value: torch.Tensor, source: str) -> None:
        """``value`` was lifted before through another source: the entry requires the same object."""
        first = self.seen.get(id(value))
        if first is not None and first[0] != source and argument_source(source):
            self.same.append((first[0], source))

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

    def check(self) -> Callable[[dict, dict], bool]:
        """``ok(L, G)``: the call's argument tensors alias as they did at trace time. A call with the
        very objects and data pointers of the last call that held (a decode loop's cache tensors) is
        answered from it: one identity and one ``data_ptr`` test per tensor."""
        sources = list(dict.fromkeys([*self.arguments, *(s for pair in self.same for s in pair)]))
        at = {s: i for i, s in enumerate(sources)}
        read = eval(f"lambda L, G: ({', '.join(sources)},)")  # noqa: S307 (sources the tracer wrote)
        same = [(at[a], at[b]) for a, b in self.same]
        n_args = len(self.arguments)  # the first n values: distinct objects at trace time
        written = [at[s] for s in self.written]
        last: list = []  # [weak references to the values, their data pointers] of the last call that held

        def ok(L: dict, G: dict) -> bool:
            try:
                vals = read(L, G)
            except Exception:  # noqa: BLE001 - a source that no longer resolves: the entry does not hold
                return False
            for i, j in same:
                if vals[i] is not vals[j]:
                    return False
            if not written:
                return True
            if last and all(v is w() for v, w in zip(vals, last[0])) and \
                    [v.data_ptr() for v in vals[:n_args]] == last[1]:
                return True
            if not all(isinstance(v, torch.Tensor) for v in vals[:n_args]):
                return False
            keys = [storage_key(v) for v in vals[:n_args]]  # one object twice: its storage twice
            for w in written:
                if keys[w] and keys.count(keys[w]) > 1:
                    return False
            last[:] = [[weakref.ref(v) for v in vals], [v.data_ptr() for v in vals[:n_args]]]
            return True
        return ok

    def failure(self, L: dict, G: dict) -> str | None:
        """Why a call does not match (for the recompile reason), or None."""
        if self.check()(L, G):
            return None
        return (f"tensor arguments alias differently from the trace (traced: "
                f"{', '.join(f'{a} is {b}' for a, b in self.same) or 'no argument passed twice'}; "
                f"written: {', '.join(self.written) or 'none'})")
