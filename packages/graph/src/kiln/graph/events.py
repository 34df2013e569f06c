"""Compile events: what happened while compiling, as typed data every stage emits the same way.

A stage calls ``emit(GraphBreakEvent(...))`` where the thing happens; ``EVENTS`` counts every event (a
few dictionary updates, cheap enough to stay on) and hands it to the listeners a tool subscribed
(``kiln.stats()`` reads the counts; the compile report keeps the events of a run). Events hold
references, not text: a listener that wants a graph's printed form prints it, so nothing is printed
when nobody listens. ``StageText`` is the exception — stages emit the text forms they already make
for KILN_DEBUG_DIR, and only when ``keeping_texts()`` says someone wants them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .knobs import KNOBS


@dataclass(frozen=True, slots=True)
class GraphCaptured:
    """Capture handed a graph to a backend. ``captured`` is the CapturedGraph (graph, inputs, guards)."""

    frame: str  # "fn (file.py:12)"
    captured: Any  # kiln.graph.CapturedGraph (Any: stages.py imports this module's users)


@dataclass(frozen=True, slots=True)
class GraphBreakEvent:
    """A frame's capture stopped at an instruction that runs in Python; the rest resumes compiled."""

    frame: str
    reason: str
    user_stack: tuple[str, ...]  # "file:line in fn", innermost first


@dataclass(frozen=True, slots=True)
class Recompile:
    """A frame's cached entries all missed: it is captured again."""

    frame: str
    reason: str  # the first failing guard of the first entry


@dataclass(frozen=True, slots=True)
class FrameRunEagerly:
    """A frame ran in plain Python, uncompiled (a break at its start, a tracing error, the recompile
    limit, a generator)."""

    frame: str
    reason: str


@dataclass(frozen=True, slots=True)
class GraphRunEagerly:
    """A backend could not compile a captured graph: it runs op by op (through ATen or torch's autograd)."""

    graph: str
    reason: str


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """The graph-level compile cache was asked for a compiled graph."""

    backend: str
    hit: bool
    key: str  # a short hash


@dataclass(frozen=True, slots=True)
class StageTime:
    """Seconds one stage (or one pass of it: ``step``) spent on one graph."""

    stage: str  # "capture" | "autograd" | "inductor" | ...
    seconds: float
    step: str = ""  # the pass, for stages run by the pass driver
    graph: str = ""


@dataclass(frozen=True, slots=True)
class StageText:
    """One stage's program in text form (what KILN_DEBUG_DIR writes as ``<graph_id>/<stage>.txt``)."""

    graph_id: str
    stage: str
    text: str


@dataclass(frozen=True, slots=True)
class GraphCompiled:
    """A backend returned for a captured graph: ``gm`` is the graph it was given."""

    backend: str
    seconds: float
    gm: Any  # the torch.fx.GraphModule of the matching GraphCaptured
    compiled: Any  # what the backend returned


Event = (GraphCaptured | GraphBreakEvent | Recompile | FrameRunEagerly | GraphRunEagerly | CacheLookup
         | StageTime | StageText | GraphCompiled)
Listener = Callable[[Event], None]


@dataclass
class EventLog:
    """Counts of every event kind since the last reset, seconds per stage, and the listeners.

    One instance per process (``EVENTS``), as compiled code and its caches are per process.
    """

    counts: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    listeners: list[tuple[Listener, bool]] = field(default_factory=list)  # (listener, wants texts)

    def emit(self, event: Event) -> None:
        self.counts[type(event).__name__] += 1
        if isinstance(event, CacheLookup):
            self.counts["CacheHit" if event.hit else "CacheMiss"] += 1
        elif isinstance(event, StageTime):
            self.seconds[event.stage] = self.seconds.get(event.stage, 0.0) + event.seconds
        elif isinstance(event, GraphCompiled):  # the whole backend call (autograd, inductor, ... inside)
            self.seconds["backend"] = self.seconds.get("backend", 0.0) + event.seconds
        for listener, _ in self.listeners:
            listener(event)

    def subscribe(self, listener: Listener, *, texts: bool = False) -> None:
        """Call ``listener`` with every event; ``texts``: stages also emit their programs' text."""
        self.listeners.append((listener, texts))

    def unsubscribe(self, listener: Listener) -> None:
        # ``==``: a bound method (``obj.on_event``) is a new object at every access, equal to the last
        self.listeners[:] = [(fn, t) for fn, t in self.listeners if fn != listener]

    def keeps_texts(self) -> bool:
        return any(t for _, t in self.listeners)

    def reset(self) -> None:
        self.counts.clear()
        self.seconds.clear()

    def snapshot(self) -> tuple[Mapping[str, int], Mapping[str, float]]:
        return dict(self.counts), dict(self.seconds)


EVENTS = EventLog()


def emit(event: Event) -> None:
    EVENTS.emit(event)


def keeping_texts() -> bool:
    """Whether stages should print their programs: KILN_DEBUG_DIR is set or a listener wants texts."""
    return KNOBS.debug_dir is not None or EVENTS.keeps_texts()
