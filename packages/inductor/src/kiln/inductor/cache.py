"""A small on-disk cache of compiled shared libraries, keyed by a hash of source + compiler + flags.

Writes are atomic (compile to a temporary name, then rename), so concurrent compilations of the same
source leave one valid file. kiln.runtime will offer shared cache APIs; until then this is the
inductor's own store under KILN_INDUCTOR_CACHE_DIR.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .knobs import KNOBS


def cache_dir() -> Path:
    d = KNOBS.cache_dir
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def content_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def lookup(name: str) -> Path | None:
    p = cache_dir() / name
    return p if p.exists() and p.stat().st_size > 0 else None


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
