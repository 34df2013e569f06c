"""Environment variables shared by all stages, read once into typed settings (STYLE.md rule 4)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class GraphKnobs:
    logs: str  # KILN_LOGS: comma-separated log names
    debug_dir: Path | None  # KILN_DEBUG_DIR: dump every stage's text form here
    verify: bool  # KILN_VERIFY=1: run the verifier after every pass


def read_knobs(env: dict[str, str] | None = None) -> GraphKnobs:
    e = os.environ if env is None else env
    debug = e.get("KILN_DEBUG_DIR")
    return GraphKnobs(
        logs=e.get("KILN_LOGS", ""),
        debug_dir=Path(debug) if debug else None,
        verify=e.get("KILN_VERIFY", "0") not in ("", "0", "false", "False"),
    )


KNOBS = read_knobs()
