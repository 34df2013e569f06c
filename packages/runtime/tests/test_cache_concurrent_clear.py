"""A built artifact survives another process clearing (or writing) the compile cache meanwhile.

The clear is injected through a CompileCache subclass (an object passed in, no patched globals) that
clears the whole cache right after a file was written for a user and before the user opened it; and
for real, by a second process clearing the cache in a loop while this one builds and loads.
"""

from __future__ import annotations

import ctypes
import logging
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from kiln.runtime import CompileCache, compile_cpp, load_cpp_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _source(value: int) -> str:
    """A library whose function returns ``value``: each test builds (and dlopens) a library of its own."""
    return f'extern "C" long kiln_value() {{ return {value}L; }}\n'


def _value(lib: ctypes.CDLL) -> int:
    fn = lib.kiln_value
    fn.restype = ctypes.c_long
    return int(fn())


class ClearingCache(CompileCache):
    """Clears itself entirely (as ``kiln cache clear`` in another process would) after each of its first
    ``clears`` writes of a file or folder for a user, and after each of its first ``put_clears`` stores."""

    def __init__(self, root: Path, clears: int = 0, put_clears: int = 0) -> None:
        super().__init__(root)
        self.clears, self.put_clears, self.cleared = clears, put_clears, 0

    def _clear_if(self, attr: str) -> None:
        if getattr(self, attr) > 0:
            setattr(self, attr, getattr(self, attr) - 1)
            self.cleared += 1
            self.clear()

    def materialize(self, namespace: str, data: bytes, suffix: str = "") -> Path:
        path = super().materialize(namespace, data, suffix)
        self._clear_if("clears")
        return path

    def materialize_tree(self, namespace: str, key: str, files: Mapping[str, bytes]) -> Path:
        folder = super().materialize_tree(namespace, key, files)
        self._clear_if("clears")
        return folder

    def put(self, namespace: str, key: str, data: bytes) -> bool:
        stored = super().put(namespace, key, data)
        self._clear_if("put_clears")
        return stored


def test_library_cleared_between_write_and_dlopen_is_written_again(tmp_path, caplog) -> None:
    value = secrets.randbelow(2**40)
    cache = ClearingCache(tmp_path / "cache", clears=2)
    data = compile_cpp(_source(value), cache=cache)
    with caplog.at_level(logging.WARNING, logger="kiln.runtime.cache"):
        lib = load_cpp_library(data, cache=cache)
    assert _value(lib) == value
    assert cache.cleared == 2  # two clears between the write and dlopen: the third write was used
    assert sum("vanished before it was used" in r.getMessage() for r in caplog.records) == 2
    assert "rebuilding" not in caplog.text  # a vanished file is written again, not taken for a foreign binary


def test_build_cleared_right_after_it_was_stored_returns_its_own_bytes(tmp_path) -> None:
    value = secrets.randbelow(2**40)
    cache = ClearingCache(tmp_path / "cache", put_clears=1)
    data = compile_cpp(_source(value), cache=cache)  # stored, then the cache cleared: the build's bytes
    assert cache.cleared == 1 and data[:4] == b"\x7fELF"
    assert _value(load_cpp_library(data, cache=cache)) == value
    assert compile_cpp(_source(value), cache=cache) == data  # the vanished entry is rebuilt, not an error


def test_tree_cleared_before_use_is_written_again(tmp_path) -> None:
    cache = ClearingCache(tmp_path / "cache", clears=1)
    files = {"a.txt": b"one", "sub/b.txt": b"two"}
    seen: list[Path] = []

    def use(folder: Path) -> bytes:
        seen.append(folder)
        return (folder / "sub" / "b.txt").read_bytes()

    assert cache.with_tree("trees", "k", files, use) == b"two"
    assert len(seen) == 2 and seen[0] == seen[1]  # the same content-addressed folder, written twice


def test_writes_recreate_folders_a_clear_removed(tmp_path) -> None:
    cache = CompileCache(tmp_path / "cache")
    first = cache.materialize_tree("trees", "k1", {"x": b"1"})  # the namespace's folder is made (and remembered)
    cache.put("ns", "key", b"data")
    shutil.rmtree(tmp_path / "cache")  # another process clears everything, the root too
    second = cache.materialize_tree("trees", "k2", {"x": b"2"})
    assert (second / "x").read_bytes() == b"2" and not first.exists()
    assert cache.get("ns", "key") is None and cache.put("ns", "key", b"data") and cache.get("ns", "key") == b"data"
    assert cache.materialize("files", b"bytes", ".bin").read_bytes() == b"bytes"
    with cache.lock("some key"):  # the locks folder is made again too
        assert any((tmp_path / "cache").rglob("*.lock"))


# what CompileCache.clear does (its folders removed), in a process that starts in milliseconds (no torch)
CLEARER = """
import shutil, sys, time
from pathlib import Path
root, stop = Path(sys.argv[1]), Path(sys.argv[2])
n = 0
print("ready", flush=True)
while not stop.exists():
    for area in ("entries", "files", "locks"):
        if (root / "v1" / area).exists():
            n += 1
        shutil.rmtree(root / "v1" / area, ignore_errors=True)
    time.sleep(0.001)
print(n)
"""


def test_builds_and_loads_survive_another_process_clearing_the_cache(tmp_path) -> None:
    """A second process clears the cache in a loop while this one builds and loads libraries into it."""
    root, stop = tmp_path / "cache", tmp_path / "stop"
    cache = CompileCache(root)
    clearer = subprocess.Popen([sys.executable, "-c", CLEARER, str(root), str(stop)], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert clearer.stdout is not None and clearer.stdout.readline().strip() == "ready"
        for v in [secrets.randbelow(2**40) for _ in range(6)]:
            data = compile_cpp(_source(v), cache=cache)
            assert _value(load_cpp_library(data, cache=cache)) == v
            assert _value(load_cpp_library(compile_cpp(_source(v), cache=cache), cache=cache)) == v
            assert cache.with_tree("trees", str(v), {"v": str(v).encode()},
                                   lambda f: int((f / "v").read_bytes())) == v
    finally:
        stop.touch()
        out, _ = clearer.communicate(timeout=60)
    assert clearer.returncode == 0 and int(out.split()[-1]) > 0  # it did clear meanwhile


def test_a_write_the_clears_defeat_every_time_is_used_from_a_private_folder(tmp_path) -> None:
    """When every attempt to write a file into the cache loses to a clear (here: always), ``with_file``
    still hands ``use`` a whole file, from a private temporary folder, not an error."""

    class AlwaysCleared(CompileCache):
        def materialize(self, namespace, data, suffix=""):  # type: ignore[no-untyped-def]
            raise FileNotFoundError("the cache folder vanished (cleared by another process)")

    data = b"\x7fELF a library"
    seen = AlwaysCleared(tmp_path / "cache").with_file("cpp_lib", data, ".so", lambda p: (p, p.read_bytes()))
    path, got = seen
    assert got == data and path.suffix == ".so" and (tmp_path / "cache") not in path.parents
