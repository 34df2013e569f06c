"""One pass driver for every package: named passes in order, with timing, verify and dumps as instruments.

Each pass is ``fn(value, ctx) -> value``. The driver stamps every output with the pass's name and
time in a ``PassRecord`` so a user can list every intermediate program (``records``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Pass(Generic[T]):
    name: str
    fn: Callable[[T, Any], T]
    doc: str = ""


@dataclass(frozen=True, slots=True)
class PassRecord:
    name: str
    seconds: float
    text: str | None  # filled when an instrument asked for it


class Instrument(Protocol):
    def after(self, name: str, value: Any, seconds: float, records: list[PassRecord]) -> None: ...


@dataclass
class VerifyAfterPass:
    """Runs ``verify(value)`` after every pass (KILN_VERIFY=1)."""

    verify: Callable[[Any], None]

    def after(self, name: str, value: Any, seconds: float, records: list[PassRecord]) -> None:
        try:
            self.verify(value)
        except Exception as e:
            raise type(e)(f"after pass {name!r}: {e}") from e


@dataclass
class KeepText:
    """Keeps each intermediate's ``as_text()`` (print-after-pass) in the records."""

    as_text: Callable[[Any], str]

    def after(self, name: str, value: Any, seconds: float, records: list[PassRecord]) -> None:
        last = records[-1]
        records[-1] = PassRecord(last.name, last.seconds, self.as_text(value))


@dataclass
class PipelineResult(Generic[T]):
    value: T
    records: list[PassRecord] = field(default_factory=list)

    def timings(self) -> str:
        return "\n".join(f"{r.name:<32} {r.seconds * 1e3:8.2f} ms" for r in self.records)


def run_pipeline(passes: Sequence[Pass[T]], value: T, ctx: Any,
                 instruments: Sequence[Instrument] = ()) -> PipelineResult[T]:
    records: list[PassRecord] = []
    for p in passes:
        t0 = time.perf_counter()
        value = p.fn(value, ctx)
        dt = time.perf_counter() - t0
        records.append(PassRecord(p.name, dt, None))
        for inst in instruments:
            inst.after(p.name, value, dt, records)
    return PipelineResult(value, records)
