"""The compile report's collector: a listener on kiln's compile events that files them per graph.

Events arrive in program order on one thread, and a backend compiles a graph synchronously between
its ``GraphCaptured`` and ``GraphCompiled`` events, so every stage text and time in between belongs to
that graph. Breaks are emitted after their graph is compiled (the break's resume plan is built last),
so a break goes to the latest graph of its frame; a recompile reason goes to the next one.
"""

from __future__ import annotations

import linecache
import re
import time
from dataclasses import dataclass, field
from typing import Any

from kiln.graph import (
    CacheLookup,
    Event,
    FrameRunEagerly,
    GraphBreakEvent,
    GraphCaptured,
    GraphCompiled,
    GraphRunEagerly,
    Recompile,
    StageText,
    StageTime,
)

# Stage texts printed elsewhere in the report: capture's (the captured graph and its guards are shown
# from the CapturedGraph itself) and the backend wrapper's copies of the outer result's texts ("01_...").
_SKIPPED_TEXT = re.compile(r"^(capture|00_captured_torch|\d\d_.*)$")
_UNSEEN_GRAPH = "(graph compiled without capture: aot_compile or a direct backend call)"


@dataclass
class Program:
    """One program a stage produced for a graph: ``kind`` is the graph id's name part (``aot``, ``forward``)."""

    graph_id: str
    texts: dict[str, str] = field(default_factory=dict)  # stage -> text, in the order they came

    @property
    def kind(self) -> str:
        return self.graph_id.partition("_")[2] or self.graph_id


@dataclass
class GraphRecord:
    """Everything the report shows about one captured graph."""

    index: int
    frame: str
    captured: Any | None  # kiln.graph.CapturedGraph (None for graphs compiled without capture)
    recompile_reason: str = ""
    capture_seconds: float = 0.0
    backend: str = ""
    backend_seconds: float = 0.0
    result_backend: str = ""  # what the backend reported ("inductor", "inductor(eager fallback)", ...)
    programs: list[Program] = field(default_factory=list)
    times: list[StageTime] = field(default_factory=list)
    cache: list[CacheLookup] = field(default_factory=list)
    breaks: list[GraphBreakEvent] = field(default_factory=list)
    eager: list[GraphRunEagerly] = field(default_factory=list)

    def program(self, graph_id: str) -> Program:
        if not self.programs or self.programs[-1].graph_id != graph_id:
            self.programs.append(Program(graph_id))
        return self.programs[-1]

    def source_lines(self) -> list[tuple[str, str]]:
        """(``file:line in fn``, the line's code) for every user line the graph's nodes came from."""
        if self.captured is None:
            return []
        seen: dict[str, str] = {}
        for node in self.captured.gm.graph.nodes:
            where = node.meta.get("stack_trace")
            if isinstance(where, str) and short_location(where) not in seen:
                seen[short_location(where)] = code_at(where)
        return list(seen.items())


# capture's node locations: a traceback line ('  File "f.py", line 3, in fn') or "f.py:3 in fn"
_LOCATION = (re.compile(r'\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<fn>.*)'),
             re.compile(r"(?P<file>.*):(?P<line>\d+) in (?P<fn>.*)"))


def _location(where: str) -> tuple[str, int, str] | None:
    for pattern in _LOCATION:
        m = pattern.match(where.strip())
        if m:
            return m["file"], int(m["line"]), m["fn"].strip()
    return None


def code_at(where: str) -> str:
    loc = _location(where)
    return linecache.getline(loc[0], loc[1]).strip() if loc else ""


def short_location(where: str) -> str:
    """``file.py:12 in fn`` for any form capture records."""
    loc = _location(where)
    return f"{loc[0]}:{loc[1]} in {loc[2]}" if loc else where.strip()


@dataclass
class RunRecord:
    """A whole run: its graphs and the events that belong to no graph."""

    started: float = field(default_factory=time.time)
    graphs: list[GraphRecord] = field(default_factory=list)
    breaks: list[GraphBreakEvent] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    eager_frames: list[FrameRunEagerly] = field(default_factory=list)
    eager_graphs: list[GraphRunEagerly] = field(default_factory=list)
    cache: list[CacheLookup] = field(default_factory=list)
    times: list[StageTime] = field(default_factory=list)
    backend_seconds: float = 0.0
    error: str = ""  # how the run ended, when it raised


class Collector:
    """Subscribe ``collector.on_event`` to ``kiln.graph.EVENTS`` (with texts); read ``collector.run``."""

    def __init__(self) -> None:
        self.run = RunRecord()
        self._current: GraphRecord | None = None
        self._capture_s: dict[str, float] = {}  # frame -> seconds of its latest capture
        self._recompile: dict[str, str] = {}  # frame -> reason, for its next graph

    def on_event(self, e: Event) -> None:
        run = self.run
        if isinstance(e, GraphCaptured):
            self._current = self._new_graph(e.frame, e.captured)
        elif isinstance(e, GraphCompiled):
            self._compiled(e)
        elif isinstance(e, StageText):
            if not _SKIPPED_TEXT.match(e.stage):
                self._graph().program(e.graph_id).texts[e.stage] = e.text
        elif isinstance(e, StageTime):
            run.times.append(e)
            if e.stage == "capture":
                self._capture_s[e.graph] = e.seconds
            elif self._current is not None:
                self._current.times.append(e)
        elif isinstance(e, GraphBreakEvent):
            run.breaks.append(e)
            owner = next((g for g in reversed(run.graphs) if g.frame == e.frame), None)
            if owner is not None:
                owner.breaks.append(e)
        elif isinstance(e, Recompile):
            run.recompiles.append(e)
            self._recompile[e.frame] = e.reason
        else:
            self._other(e)

    def _other(self, e: Event) -> None:
        if isinstance(e, FrameRunEagerly):
            self.run.eager_frames.append(e)
        elif isinstance(e, GraphRunEagerly):
            self.run.eager_graphs.append(e)
            if self._current is not None:
                self._current.eager.append(e)
        elif isinstance(e, CacheLookup):
            self.run.cache.append(e)
            if self._current is not None:
                self._current.cache.append(e)

    def _new_graph(self, frame: str, captured: Any | None) -> GraphRecord:
        g = GraphRecord(len(self.run.graphs), frame, captured,
                        recompile_reason=self._recompile.pop(frame, ""),
                        capture_seconds=self._capture_s.pop(frame, 0.0))
        self.run.graphs.append(g)
        return g

    def _graph(self) -> GraphRecord:
        if self._current is None:
            self._current = self._new_graph(_UNSEEN_GRAPH, None)
        return self._current

    def _compiled(self, e: GraphCompiled) -> None:
        g = self._current
        if g is None or (g.captured is not None and g.captured.gm is not e.gm):
            g = self._new_graph(_UNSEEN_GRAPH, None)
        g.backend, g.backend_seconds = e.backend, e.seconds
        g.result_backend = str(getattr(e.compiled, "backend", e.backend))
        self.run.backend_seconds += e.seconds
        self._current = None
