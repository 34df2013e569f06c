"""Timers: how long one launch takes, in milliseconds. ``DeviceTimer`` measures on the GPU; tests use
``FakeTimer`` to make selection deterministic."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch


class Timer(Protocol):
    def __call__(self, launch: Callable[[], object], label: str) -> float: ...


class DeviceTimer:
    """Median time of a launch on the current CUDA device.

    Uses ``triton.testing.do_bench`` (which also flushes L2 between runs) when triton is importable,
    else CUDA events around repeated launches.
    """

    def __init__(self, warmup_ms: float = 5.0, rep_ms: float = 20.0) -> None:
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms

    def __call__(self, launch: Callable[[], object], label: str) -> float:
        try:
            from triton.testing import do_bench
        except ImportError:
            return self._events(launch)
        return float(do_bench(launch, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))

    def _events(self, launch: Callable[[], object]) -> float:
        launch()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            launch()
        end.record()
        end.synchronize()
        est = max(start.elapsed_time(end) / 3, 1e-3)
        times = []
        for _ in range(max(3, min(200, int(self.rep_ms / est)))):
            start.record()
            launch()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]


class FakeTimer:
    """Times looked up by config label (unknown labels cost ``default``); records what was timed."""

    def __init__(self, times: Mapping[str, float], default: float = 1.0) -> None:
        self.times = dict(times)
        self.default = default
        self.timed: list[str] = []

    def __call__(self, launch: Callable[[], object], label: str) -> float:
        launch()
        self.timed.append(label)
        return self.times.get(label, self.default)
