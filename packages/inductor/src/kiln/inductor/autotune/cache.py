"""The autotune cache: chosen configurations on disk, so a second process does not re-tune.

One small JSON file (``KILN_CACHE_DIR/inductor/autotune.json`` by default): entries keyed by
``tune_key`` — a hash of the kernel source (or template and epilogue), the device name, and the sizes
and dtypes it was tuned for. Writes merge with what is on disk and replace the file atomically, so
concurrent processes lose nothing but a racing duplicate. kiln.runtime's compile cache may take this
over; the format is versioned for that.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.graph import log

from ..knobs import KNOBS
from .config import Config

SCHEMA = 1


def tune_key(source: str, device_name: str, sizes: Sequence[object], dtypes: Sequence[object] = ()) -> str:
    """The cache key of one tuning problem."""
    h = hashlib.sha256()
    for part in (source, device_name, repr(tuple(sizes)), repr(tuple(str(d) for d in dtypes))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def default_cache_path() -> Path:
    return KNOBS.cache_dir / "autotune.json"


class AutotuneCache:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self._entries: dict[str, dict[str, Any]] | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log("perf_hints").info("autotune cache %s unreadable (%s); starting empty", self.path, e)
            return {}
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            return {}
        entries = data.get("entries", {})
        return entries if isinstance(entries, dict) else {}

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = self._load()
        return self._entries

    def get(self, key: str) -> tuple[Config, float] | None:
        e = self.entries.get(key)
        if e is None:
            return None
        try:
            return Config.from_json(e["config"]), float(e["ms"])
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, config: Config, ms: float, note: str = "") -> None:
        entry = {"config": config.to_json(), "ms": ms, "note": note, "time": time.time()}
        self.entries[key] = entry
        merged = {**self._load(), key: entry}  # keep what other processes wrote meanwhile
        self._entries.update(merged)  # type: ignore[union-attr]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"schema": SCHEMA, "entries": merged}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as e:
            log("perf_hints").info("could not write autotune cache %s: %s", self.path, e)
            Path(tmp).unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self.entries)
