"""``kiln.stats()``: what kiln compiled in this process, as a frozen snapshot, for tools and tests.

The counts come from the compile events every stage emits (``kiln.graph.events``); a snapshot is
plain data, so two of them subtract (``after - before``) to give what one piece of code did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from kiln.graph import EVENTS


@dataclass(frozen=True)
class CompileStats:
    """Counts since the process started (or ``kiln.stats_reset()``)."""

    graphs_captured: int = 0  # graphs capture handed to a backend
    graphs_compiled: int = 0  # graphs a kiln.compile backend returned a callable for
    graph_breaks: int = 0  # breaks met while capturing (each once, when its entry is made)
    recompiles: int = 0  # frames captured again because every cached entry's guards failed
    cache_hits: int = 0  # graphs loaded from the graph-level compile cache
    cache_misses: int = 0  # graphs looked up there and compiled
    frames_run_eagerly: int = 0  # frames run uncompiled (break at their start, recompile limit, ...)
    graphs_run_eagerly: int = 0  # captured graphs a backend could not compile, run op by op
    compile_seconds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __sub__(self, other: CompileStats) -> CompileStats:
        counts = {f.name: getattr(self, f.name) - getattr(other, f.name)
                  for f in fields(self) if f.name != "compile_seconds"}
        secs = {k: v - other.compile_seconds.get(k, 0.0) for k, v in self.compile_seconds.items()}
        return CompileStats(**counts, compile_seconds=MappingProxyType(
            {k: v for k, v in secs.items() if v > 0}))

    @property
    def total_compile_seconds(self) -> float:
        """Capture plus every backend's time ("backend" includes autograd and inductor)."""
        return self.compile_seconds.get("capture", 0.0) + self.compile_seconds.get("backend", 0.0)

    def as_text(self) -> str:
        lines = [f"{f.name:<20} {getattr(self, f.name)}" for f in fields(self) if f.name != "compile_seconds"]
        lines += [f"compile s {stage:<10} {s:.3f}" for stage, s in sorted(self.compile_seconds.items())]
        return "\n".join(lines)


# CompileStats field -> the event kind counted
_COUNTED = {
    "graphs_captured": "GraphCaptured", "graphs_compiled": "GraphCompiled", "graph_breaks": "GraphBreakEvent",
    "recompiles": "Recompile", "cache_hits": "CacheHit", "cache_misses": "CacheMiss",
    "frames_run_eagerly": "FrameRunEagerly", "graphs_run_eagerly": "GraphRunEagerly",
}


def stats() -> CompileStats:
    """A snapshot of kiln's compile counters (``kiln.stats()``)."""
    counts, seconds = EVENTS.snapshot()
    return CompileStats(**{name: counts.get(kind, 0) for name, kind in _COUNTED.items()},
                        compile_seconds=MappingProxyType(seconds))


def stats_reset() -> None:
    """Start the counters again from zero (``kiln.stats_reset()``); compiled code is kept."""
    EVENTS.reset()
