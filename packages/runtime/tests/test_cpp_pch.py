"""C++ kernels with a precompiled header: the same library bytes as a whole-source build, the header built
once per compiler and flags, and a whole-source build (logged) when the header cannot be precompiled or
its .gch is refused."""

from __future__ import annotations

import ctypes
import logging
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.runtime import PCH_END, CompileCache, KernelBuildError, compile_cpp, load_cpp_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# each test's header is its own (a process keeps the precompiled headers it used, by their text)
TAG = secrets.token_hex(8)
HEADER = "#include <cmath>\n#include <algorithm>\n" \
         "template <typename T> static inline T twice(T x) { return std::max(x, x) * T(2); }\n" + PCH_END
FLAGS = ("-O2", "-shared", "-fPIC")


def _source(value: int, test: str) -> str:
    return f"// {TAG} {test}\n" + HEADER + \
        f'extern "C" double kiln_value(double x) {{ return twice(x) + std::sqrt({value}.0); }}\n'


def _call(data: bytes, cache: CompileCache, x: float) -> float:
    fn = load_cpp_library(data, cache=cache).kiln_value
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double]
    return float(fn(x))


def _entries(cache: CompileCache, namespace: str) -> int:
    return cache.info().namespaces.get(namespace, (0, 0))[0]


def test_precompiled_header_gives_the_same_library_bytes(tmp_path) -> None:
    value = secrets.randbelow(10**6)
    with_pch, whole = CompileCache(tmp_path / "a"), CompileCache(tmp_path / "b")
    data = compile_cpp(_source(value, "bytes"), flags=FLAGS, cache=with_pch, pch=True)
    assert data == compile_cpp(_source(value, "bytes"), flags=FLAGS, cache=whole, pch=False)
    assert _entries(with_pch, "cpp_pch") == 1 and _entries(whole, "cpp_pch") == 0
    assert _call(data, with_pch, 3.0) == 6.0 + value ** 0.5
    # another library with the same header reuses its precompiled header
    other = compile_cpp(_source(value + 1, "bytes"), flags=FLAGS, cache=with_pch, pch=True)
    assert _entries(with_pch, "cpp_pch") == 1 and _entries(with_pch, "cpp_so") == 2
    assert _call(other, with_pch, 1.5) == 3.0 + (value + 1) ** 0.5


def _compiler(tmp_path: Path, body: str) -> str:
    """A g++ in front of which ``body`` (shell) runs: injected as the ``cxx`` argument."""
    script = tmp_path / "cxx.sh"
    script.write_text(f"#!/bin/sh\n{body}\nexec g++ \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_header_the_compiler_cannot_precompile_builds_the_whole_source(tmp_path, caplog) -> None:
    cxx = _compiler(tmp_path, 'case "$*" in *c++-header*) echo "no headers here" >&2; exit 1;; esac')
    cache = CompileCache(tmp_path / "cache")
    value = secrets.randbelow(10**6)
    with caplog.at_level(logging.INFO, logger="kiln.runtime"):
        data = compile_cpp(_source(value, "cannot"), flags=FLAGS, cxx=cxx, cache=cache, pch=True)
    assert "without a precompiled header" in caplog.text and "no headers here" in caplog.text
    assert _entries(cache, "cpp_pch") == 0
    assert data == compile_cpp(_source(value, "cannot"), flags=FLAGS, cache=CompileCache(tmp_path / "whole"), cxx=cxx,
                               pch=False)
    assert _call(data, cache, 2.0) == 4.0 + value ** 0.5


class CorruptPch(CompileCache):
    """A cache whose precompiled headers are garbage (a .gch g++ must refuse, not trust)."""

    def get_or_build(self, namespace: str, key: str, build: Callable[[], bytes]) -> bytes:
        if namespace == "cpp_pch":
            return b"not a precompiled header"
        return super().get_or_build(namespace, key, build)


def test_refused_precompiled_header_is_logged_and_the_header_text_used(tmp_path, caplog) -> None:
    value = secrets.randbelow(10**6)
    cache = CorruptPch(tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="kiln.runtime"):
        data = compile_cpp(_source(value, "refused"), flags=FLAGS, cache=cache, pch=True)
    assert "built without their precompiled header" in caplog.text
    assert data == compile_cpp(_source(value, "refused"), flags=FLAGS, cache=CompileCache(tmp_path / "whole"), pch=False)
    assert _call(data, cache, 1.0) == 2.0 + value ** 0.5


def test_compile_errors_name_the_original_lines(tmp_path) -> None:
    """A kernel that does not compile fails with g++'s message (after a whole-source attempt), at its line in
    the whole source."""
    source = HEADER + "extern \"C\" int f() {\n  return undefined_name;\n}\n"
    with pytest.raises(KernelBuildError, match="undefined_name") as e:
        compile_cpp(source, flags=FLAGS, cache=CompileCache(tmp_path / "cache"), pch=True)
    assert f"kernel.cpp:{HEADER.count(chr(10)) + 2}" in str(e.value)
