"""What the autotuner chooses between: launch configurations, and candidates pairing one with a launch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Config:
    """One launch configuration: constexpr block sizes, warps, pipeline stages (or an extern's name)."""

    constants: tuple[tuple[str, int], ...] = ()  # e.g. (("XBLOCK", 128), ("RBLOCK", 64))
    num_warps: int = 4
    num_stages: int = 1
    extern: str = ""  # non-empty for a library kernel (e.g. "cublas") competing with generated ones

    @staticmethod
    def make(num_warps: int = 4, num_stages: int = 1, extern: str = "", **constants: int) -> Config:
        return Config(tuple(sorted(constants.items())), num_warps, num_stages, extern)

    def get(self, name: str, default: int = 0) -> int:
        return dict(self.constants).get(name, default)

    @property
    def label(self) -> str:
        if self.extern:
            return self.extern
        consts = ",".join(f"{k}={v}" for k, v in self.constants)
        return f"{consts},warps={self.num_warps},stages={self.num_stages}"

    def to_json(self) -> dict[str, Any]:
        return {"constants": dict(self.constants), "num_warps": self.num_warps,
                "num_stages": self.num_stages, "extern": self.extern}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Config:
        return Config(tuple(sorted((str(k), int(v)) for k, v in d.get("constants", {}).items())),
                      int(d.get("num_warps", 4)), int(d.get("num_stages", 1)), str(d.get("extern", "")))


@dataclass(frozen=True)
class Candidate:
    """A configuration and a zero-argument callable that launches the kernel with it once."""

    config: Config
    launch: Callable[[], object]
    is_default: bool = False  # the untuned choice: a tuned one must beat it to be kept


@dataclass(frozen=True)
class Choice:
    config: Config
    ms: float  # measured time of the choice (from the cache when ``cached``)
    cached: bool
    timings: dict[str, float] = field(default_factory=dict)  # label -> ms (inf: failed to run)
    failures: dict[str, str] = field(default_factory=dict)  # label -> why it could not run
