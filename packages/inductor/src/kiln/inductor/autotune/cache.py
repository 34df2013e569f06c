"""The autotune cache: chosen configurations kept in kiln.runtime's compile cache, so a second process
(or a second compile of the same model) does not re-tune.

Entries live in the ``autotune`` namespace of a ``kiln.runtime.CompileCache`` (``KILN_CACHE_DIR`` by
default): one small JSON value per tuning problem. The stored key is ``kiln.runtime.cache_key`` over
``tune_key`` — the kernel source (or template, epilogue and candidate list), the device name, and the
sizes, strides and dtypes tuned for — so the torch, triton and kiln versions are part of it too.
The compile cache verifies every read and publishes writes atomically (concurrent processes race
harmlessly); when it is disabled (``KILN_CACHE=0``) results are kept for this process only.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.graph import log
from kiln.runtime import CompileCache, cache_key, default_cache

from .config import Config

SCHEMA = 2
NAMESPACE = "autotune"


def tune_key(source: str, device_name: str, sizes: Sequence[object], dtypes: Sequence[object] = ()) -> str:
    """The cache key of one tuning problem (before kiln.runtime adds the library versions)."""
    h = hashlib.sha256()
    for part in (source, device_name, repr(tuple(sizes)), repr(tuple(str(d) for d in dtypes))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


class AutotuneCache:
    """``get(key) -> (Config, ms) | None`` and ``put(key, config, ms)`` over a CompileCache.

    ``root``: a CompileCache, a directory for one, or None for the process's default cache.
    """

    def __init__(self, root: CompileCache | Path | str | None = None) -> None:
        if isinstance(root, CompileCache):
            self.store = root
        else:
            self.store = CompileCache(root) if root is not None else default_cache()
        self._memory: dict[str, dict[str, Any]] = {}  # this process's results (the store may be disabled)

    @staticmethod
    def _stored_key(key: str) -> str:
        return cache_key(f"kiln.inductor.autotune/{SCHEMA}", key)

    def _entry(self, key: str) -> dict[str, Any] | None:
        if key in self._memory:
            return self._memory[key]
        value = self.store.get_json(NAMESPACE, self._stored_key(key))
        if isinstance(value, dict) and value.get("schema") == SCHEMA:
            self._memory[key] = value
            return value
        return None

    def get(self, key: str) -> tuple[Config, float] | None:
        e = self._entry(key)
        if e is None:
            return None
        try:
            return Config.from_json(e["config"]), float(e["ms"])
        except (KeyError, TypeError, ValueError):
            log("perf_hints").info("autotune cache entry %s is malformed; re-tuning", key)
            return None

    def put(self, key: str, config: Config, ms: float, note: str = "") -> None:
        entry = {"schema": SCHEMA, "config": config.to_json(), "ms": ms, "note": note, "time": time.time()}
        self._memory[key] = entry
        if not self.store.put_json(NAMESPACE, self._stored_key(key), entry) and self.store.enabled:
            log("perf_hints").info("could not write autotune result %s to the compile cache %s", note,
                                   self.store.root)

    def __contains__(self, key: str) -> bool:
        return self._entry(key) is not None
