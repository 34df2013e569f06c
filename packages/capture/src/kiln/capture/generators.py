"""Generators inside compiled code, run lazily as CPython runs them.

Note: calling a generator function (or a generator expression) inside the trace makes a
``TracedGenerator`` holding the callee's suspended frame; nothing of its body runs until it is
advanced (``next``, a ``for`` loop, ``send``, ``yield from``, a consumer such as ``sum``/``list``/
``zip``). Each advance runs the frame to its next ``YIELD_VALUE`` (``Frame.run_inlined`` stops
there), so the body's tensor work, side effects and exceptions interleave with the consumer's in
eager's order, and an infinite generator (``while True: yield i``) zipped with a list stops where
eager stops. ``zip``/``enumerate``/``map`` over one are lazy (``LazyIterator``).

A generator cannot leave the graph as a traced frame: returned, stored, or live at a graph break
(a break inside its body makes it live at the breaking instruction) it must be a real generator.
One not started yet is rebuilt by calling the function again after the graph (its body has not
run); a started one raises ``BuiltModuleEscapes`` and the capture runs again with a break at its
creation, so it is made and run in Python on every call (``capture.run_capture``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import polyfills
from .errors import GraphBreak, SkipFrame
from .module_init import BuiltModuleEscapes, Site, site_of
from .values import InterpIterator

if TYPE_CHECKING:
    from .frame import Frame


@dataclass(eq=False)
class TracedGenerator(InterpIterator):
    """A generator made in the trace: its suspended frame, and how to make it again (``callee`` called
    with ``args``/``kwargs``) while it has not started."""

    frame: Frame
    site: Site
    callee: Any
    args: list
    kwargs: dict
    started: bool = False
    running: bool = False
    done: bool = False

    @property
    def name(self) -> str:
        return self.frame.code.co_name

    def send(self, value: Any) -> Any:
        if self.running:
            raise ValueError("generator already executing")
        if self.done:
            raise StopIteration
        frame = self.frame
        if not self.started:
            if value is not None:
                raise TypeError("can't send non-None value to a just-started generator")
            self.started = True
        else:
            frame.suspended = False
            frame.push(value)  # the value of the ``yield`` expression
        self.running = True
        try:
            frame.run_inlined()
        except StopIteration as e:  # PEP 479 (3.12+ does this in bytecode, 3.11 in C)
            self.done = True
            raise RuntimeError("generator raised StopIteration") from e
        except BaseException:
            self.done = True
            raise
        finally:
            self.running = False
        if frame.suspended:
            return frame.yielded
        self.done = True
        raise StopIteration(frame.result.value)

    def next(self) -> Any:
        return self.send(None)

    def close(self) -> None:
        """``close()``: a generator suspended inside a ``try``/``with`` would run its handlers on
        ``GeneratorExit``; kiln does not model that (a break: the generator runs in Python)."""
        if self.cleanup_pending():
            raise GraphBreak(f"close() of the generator {self.name} suspended inside try/with",
                             "the generator runs in Python")
        self.done = True

    def escapes(self) -> BuiltModuleEscapes:
        return BuiltModuleEscapes(self.site, f"generator {self.name}")

    def cleanup_pending(self) -> bool:
        """Suspended at a yield covered by a handler of its own (``try``/``finally``, ``with``): not
        3.12+'s whole-body handler that turns StopIteration into RuntimeError. Inside ``yield from``
        (the yield right after SEND), closing it closes the sub-generator first: its cleanup counts,
        and the handlers around the SEND are the ones that matter (3.12+ covers the yield itself
        with CLEANUP_THROW, for ``throw``)."""
        frame = self.frame
        if not self.started or self.done or frame.current is None:
            return False
        offset = frame.current.offset
        before = frame.insts[frame.current.index - 1] if frame.current.index else None
        if before is not None and before.opname == "SEND":
            sub = frame.stack[-1] if frame.stack else None
            if isinstance(sub, TracedGenerator) and sub.cleanup_pending():
                return True
            offset = before.offset
        for entry in frame.exc_table:
            if entry.start <= offset < entry.end:
                return self.frame.insts[self.frame.index_of[entry.target]].opname != "CALL_INTRINSIC_1"
        return False


@dataclass(eq=False)
class LazyIterator(InterpIterator):
    """``zip``/``enumerate``/``map`` over a generator of the trace: each ``next`` pulls its items then,
    as CPython's lazy builtins do. ``sources`` are the iterators it reads (for rebuilding)."""

    pull: Callable[[], Any]
    sources: list = field(default_factory=list)

    def next(self) -> Any:
        return self.pull()

    def escapes(self) -> BuiltModuleEscapes | None:
        for s in self.sources:
            if isinstance(s, (TracedGenerator, LazyIterator)):
                found = s.escapes()
                if found is not None:
                    return found
        return None


@dataclass(eq=False)
class GeneratorMethod:
    """``gen.send`` / ``gen.__next__`` / ``gen.close`` bound to a generator of the trace."""

    gen: TracedGenerator
    name: str

    def call(self, args: list, kwargs: dict) -> Any:
        if kwargs:
            raise TypeError(f"generator.{self.name}() takes no keyword arguments")
        if self.name == "send":
            (value,) = args
            return self.gen.send(value)
        if self.name == "__next__":
            return self.gen.next()
        if self.name == "close":
            return self.gen.close()
        raise GraphBreak(f"generator.{self.name}() inside compiled code", "the generator runs in Python")


GENERATOR_METHODS = ("send", "__next__", "close", "throw")


def make_generator(frame: Frame, child: Frame, callee: Any, args: list, kwargs: dict) -> TracedGenerator:
    """A call of a generator function inside the trace (``child`` is its frame, not yet run)."""
    site = site_of(frame)
    if site in frame.ctx.escaping_builds:
        raise GraphBreak(f"generator {child.code.co_name} made in compiled code outlives the graph (returned, "
                         "stored, or live at a graph break once started)",
                         "it is made and run in Python on every call")
    gen = TracedGenerator(child, site, callee, list(args), dict(kwargs))
    frame.ctx.generators.append(gen)
    return gen


def refuse_dropped_cleanup(generators: list[TracedGenerator]) -> None:
    """A generator left suspended inside ``try``/``with`` runs its handlers when eager drops it
    (``GeneratorExit``, at a moment set by reference counting): kiln does not model that, so the
    frame runs eagerly (as torch.compile runs frames with generators it cannot trace)."""
    for gen in generators:
        if gen.cleanup_pending():
            raise SkipFrame(f"the generator {gen.name} is left suspended inside try/finally or with, and eager "
                            "runs its cleanup when the generator is dropped")


def lazy_zip(iterators: list[InterpIterator], strict: bool) -> LazyIterator:
    def pull() -> tuple:
        out = []
        for k, it in enumerate(iterators):
            try:
                out.append(it.next())
            except StopIteration:
                if strict and (k > 0 or _not_exhausted(iterators[1:])):
                    raise ValueError("zip() arguments have different lengths") from None
                raise
        return tuple(out)
    return LazyIterator(pull, list(iterators))


def _not_exhausted(iterators: list[InterpIterator]) -> bool:
    for it in iterators:
        try:
            it.next()
            return True
        except StopIteration:
            continue
    return False


def lazy_enumerate(it: InterpIterator, start: Any) -> LazyIterator:
    count = [start]

    def pull() -> tuple:
        v = it.next()
        i = count[0]
        count[0] = i + 1
        return (i, v)
    return LazyIterator(pull, [it])


def lazy_map(frame: Frame, fn: Any, iterators: list[InterpIterator]) -> LazyIterator:
    inner = lazy_zip(iterators, strict=False)
    return LazyIterator(lambda: frame.call(fn, list(inner.next()), {}), [inner])


def is_lazy(v: Any) -> bool:
    return isinstance(v, (TracedGenerator, LazyIterator))


# itertools functions given a generator of the trace: their Python versions, generators themselves, so
# the generator is advanced when eager's would be (other C callables that wrap one break: calls.py)
LAZY_POLYFILLS: dict[Any, Callable] = {itertools.chain: polyfills.chain_, itertools.islice: polyfills.islice_}


def lazy_polyfill(fn: Any, args: list, kwargs: dict) -> Callable | None:
    try:
        poly = LAZY_POLYFILLS.get(fn)
    except TypeError:  # unhashable callable
        return None
    if poly is not None and any(is_lazy(a) for a in [*args, *kwargs.values()]):
        return poly
    return None
