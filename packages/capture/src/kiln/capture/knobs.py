"""Environment variables read once (STYLE.md rule 4) and the options passed down a capture."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CaptureKnobs:
    recompile_limit: int  # KILN_RECOMPILE_LIMIT: default limit for optimize()
    inline_depth: int  # KILN_INLINE_DEPTH: deepest inlined call chain before a graph break


def read_knobs(env: dict[str, str] | None = None) -> CaptureKnobs:
    e = os.environ if env is None else env
    return CaptureKnobs(
        recompile_limit=int(e.get("KILN_RECOMPILE_LIMIT", "8")),
        inline_depth=int(e.get("KILN_INLINE_DEPTH", "64")),
    )


KNOBS = read_knobs()


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """What one optimize() call asked for; passed explicitly to every capture."""

    fullgraph: bool = False
    dynamic: bool | None = None  # None: automatic (second distinct size), True: all dims, False: none
    recompile_limit: int = 8


def user_environment() -> os._Environ[str]:
    """The process environment as the user's code sees it: not a kiln setting, but state a traced
    program may read (guarded whole by the tracer when it does)."""
    return os.environ
