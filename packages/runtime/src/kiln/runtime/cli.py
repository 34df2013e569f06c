"""What the meta-package's CLI calls for ``kiln cache info`` and ``kiln cache clear``."""

from __future__ import annotations

import os

from .artifact import load_artifact
from .cache import CacheInfo, CompileCache


def cache_info(root: str | os.PathLike | None = None) -> CacheInfo:
    return CompileCache(root).info()


def cache_info_text(root: str | os.PathLike | None = None) -> str:
    """The text ``kiln cache info`` prints: location, entry count, size per namespace."""
    return cache_info(root).as_text()


def cache_clear(root: str | os.PathLike | None = None, namespace: str | None = None) -> str:
    """Clear the cache (or one namespace); returns the line ``kiln cache clear`` prints."""
    cache = CompileCache(root)
    removed = cache.clear(namespace)
    what = f"namespace {namespace!r} of " if namespace else ""
    return f"removed {removed} files from {what}the kiln compile cache at {cache.root}"


def artifact_text(path: str | os.PathLike) -> str:
    """``kiln artifact PATH``: an artifact's manifest and program, without checking compatibility."""
    return load_artifact(path, check_compatibility=False).as_text()
