"""KILN_DEBUG_DIR: every stage's text form, one file per stage, one folder per compiled graph."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from .events import EVENTS, StageText
from .knobs import KNOBS

_counter = itertools.count()


def new_graph_id(name: str) -> str:
    """A folder name for one compiled graph: ``003_forward``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "graph"
    return f"{next(_counter):03d}_{safe}"


def dump(graph_id: str, stage: str, text: str, debug_dir: Path | None = None) -> Path | None:
    """Write ``text`` to ``<KILN_DEBUG_DIR>/<graph_id>/<stage>.txt`` (no file when unset), and hand it
    to the event listeners that keep texts (the compile report)."""
    if EVENTS.keeps_texts():
        EVENTS.emit(StageText(graph_id, stage, text))
    root = debug_dir if debug_dir is not None else KNOBS.debug_dir
    if root is None:
        return None
    folder = root / graph_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stage}.txt"
    path.write_text(text)
    return path
