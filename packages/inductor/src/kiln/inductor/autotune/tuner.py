"""The autotuner: benchmark candidates (configuration -> launch), keep the fastest, remember it on disk.

A candidate that fails to compile or run (too many registers, shared memory) is skipped with its error
recorded. When a default candidate is given, a tuned one replaces it only when it is faster by
``margin`` (measurement noise must not make max-autotune slower than the default mode): the default
is kept unless a candidate takes less than ``(1 - margin)`` of its time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.graph import log

from .cache import AutotuneCache
from .config import Candidate, Choice, Config
from .progress import LogProgress, Progress
from .timing import DeviceTimer, Timer


class NoViableCandidate(RuntimeError):
    pass


@dataclass
class Autotuner:
    timer: Timer
    cache: AutotuneCache | None = None
    progress: Progress | None = None
    margin: float = 0.03  # a non-default candidate must be this much faster than the default

    @staticmethod
    def for_device(cache: AutotuneCache | None = None, progress: Progress | None = None) -> Autotuner:
        return Autotuner(DeviceTimer(), cache if cache is not None else AutotuneCache(), progress)

    def cached(self, key: str, configs: Sequence[Config]) -> Choice | None:
        """The stored choice for ``key`` when it is one of ``configs`` (else the problem is re-tuned)."""
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is None or hit[0] not in configs:
            return None
        return Choice(hit[0], hit[1], cached=True)

    def select(self, name: str, key: str, candidates: Sequence[Candidate]) -> Choice:
        """The cached choice, else ``measure``."""
        if not candidates:
            raise NoViableCandidate(f"{name}: no candidate configurations to tune")
        choice = self.cached(key, [c.config for c in candidates])
        if choice is not None:
            (self.progress or LogProgress()).done(name, choice, None)
            return choice
        return self.measure(name, key, candidates)

    def measure(self, name: str, key: str, candidates: Sequence[Candidate]) -> Choice:
        """Time every candidate (serially: one kernel on the device at a time), keep the fastest by
        the margin rule (``_pick``) and store it in the cache."""
        if not candidates:
            raise NoViableCandidate(f"{name}: no candidate configurations to tune")
        progress = self.progress or LogProgress()
        progress.start(name, len(candidates))
        timings: dict[str, float] = {}
        failures: dict[str, str] = {}
        for c in candidates:
            try:
                ms = float(self.timer(c.launch, c.config.label))
            except Exception as e:  # a config that cannot compile or launch is just not a choice
                failures[c.config.label] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                timings[c.config.label] = math.inf
                log("perf_hints").info("max-autotune: %s: %s failed: %s", name, c.config.label,
                                       failures[c.config.label])
                continue
            timings[c.config.label] = ms
            progress.measured(name, c.config, ms)
        best = _pick(candidates, timings, self.margin)
        if best is None:
            raise NoViableCandidate(f"{name}: every configuration failed: {failures}")
        default = next((c for c in candidates if c.is_default), None)
        choice = Choice(best.config, timings[best.config.label], cached=False, timings=timings, failures=failures)
        if self.cache is not None:
            self.cache.put(key, best.config, choice.ms, note=name)
        progress.done(name, choice, timings.get(default.config.label) if default is not None else None)
        return choice


def _pick(candidates: Sequence[Candidate], timings: dict[str, float], margin: float) -> Candidate | None:
    ok = [c for c in candidates if math.isfinite(timings[c.config.label])]
    if not ok:
        return None
    fastest = min(ok, key=lambda c: timings[c.config.label])
    default = next((c for c in ok if c.is_default), None)
    if default is None or fastest is default:
        return fastest
    if timings[fastest.config.label] < timings[default.config.label] * (1.0 - margin):
        return fastest
    return default
