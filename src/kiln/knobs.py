"""Environment variables of the meta-package, read once into typed settings (STYLE.md rule 4).

KILN_REPORT=dir   write one compile report (a self-contained HTML page) per process into ``dir``
                  when the process exits (``kiln report script.py`` does the same for one script)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class KilnKnobs:
    report_dir: Path | None


def read_knobs(env: Mapping[str, str] | None = None) -> KilnKnobs:
    e = os.environ if env is None else env
    report = e.get("KILN_REPORT")
    return KilnKnobs(report_dir=Path(report).expanduser() if report else None)


def child_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with ``overrides``, for a child process that must read other settings
    at import (``kiln report --no-graph-cache`` runs the script in one)."""
    return {**os.environ, **overrides}


KNOBS = read_knobs()
