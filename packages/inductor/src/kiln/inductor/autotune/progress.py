"""Progress while tuning: a line per kernel on stderr (tuning takes seconds; users should see why), and
per-configuration detail in the ``perf_hints`` log."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from kiln.graph import log

from .config import Choice, Config


class Progress(Protocol):
    def start(self, name: str, n: int) -> None: ...

    def measured(self, name: str, config: Config, ms: float) -> None: ...

    def done(self, name: str, choice: Choice, default_ms: float | None) -> None: ...


class LogProgress:
    """Everything to the ``perf_hints`` log only (quiet unless that log is enabled)."""

    def start(self, name: str, n: int) -> None:
        log("perf_hints").info("max-autotune: %s: benchmarking %d configurations", name, n)

    def measured(self, name: str, config: Config, ms: float) -> None:
        log("perf_hints").info("max-autotune: %s: %-44s %.4f ms", name, config.label, ms)

    def done(self, name: str, choice: Choice, default_ms: float | None) -> None:
        vs = f" (default {default_ms:.4f} ms)" if default_ms is not None else ""
        src = "cached" if choice.cached else "tuned"
        log("perf_hints").info("max-autotune: %s: %s %s %.4f ms%s", name, src, choice.config.label, choice.ms, vs)


class ConsoleProgress(LogProgress):
    """LogProgress plus a running line on stderr: ``kiln max-autotune [3/12] kernel: 5/24 configs``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.kernels = 0
        self._n = 0
        self._i = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def start(self, name: str, n: int) -> None:
        super().start(name, n)
        self.kernels += 1
        self._n, self._i = n, 0

    def measured(self, name: str, config: Config, ms: float) -> None:
        super().measured(name, config, ms)
        self._i += 1
        if self._tty:
            self.stream.write(f"\rkiln max-autotune [{self.kernels}] {name}: {self._i}/{self._n} configs")
            self.stream.flush()

    def done(self, name: str, choice: Choice, default_ms: float | None) -> None:
        super().done(name, choice, default_ms)
        if choice.cached:
            return
        gain = f", {default_ms / choice.ms:.2f}x the default" if default_ms and choice.ms > 0 else ""
        end = "\r" if self._tty else ""
        self.stream.write(f"{end}kiln max-autotune [{self.kernels}] {name}: {choice.config.label} "
                          f"{choice.ms * 1e3:.1f} us{gain}\n")
        self.stream.flush()
