"""The meta-package's settings: compile options as a frozen dataclass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class CompileOptions:
    """Everything kiln.compile was asked for; part of every cache key by declaration."""

    backend: str = "inductor"
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"kiln.compile: unknown mode {self.mode!r}; expected one of {MODES}")
