"""Compile a C++ translation unit into a shared library with g++, cached by content hash."""

from __future__ import annotations

import functools
import os
import subprocess
import time
from pathlib import Path

from kiln.graph import KilnError

from ... import cache
from ...options import InductorOptions


class CppCompileError(KilnError):
    """g++ rejected generated code: a kiln bug; the message holds the compiler's output and the source."""


@functools.cache
def compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    except (OSError, subprocess.CalledProcessError) as e:
        raise KilnError(f"the C++ backend needs a C++ compiler; running {cxx!r} failed: {e}. Install g++ "
                        "or set InductorOptions(cxx=...)") from e


def build_shared_library(source: str, options: InductorOptions) -> tuple[Path, float]:
    """Return (path of the .so, seconds spent compiling; 0 on a cache hit)."""
    key = cache.content_key(source, compiler_version(options.cxx), " ".join(options.cpp_flags + options.link_flags))
    so_name = f"k_{key}.so"
    hit = cache.lookup(so_name)
    if hit is not None:
        return hit, 0.0
    d = cache.cache_dir()
    cpp = d / f"k_{key}.cpp"
    cache.atomic_write(cpp, source.encode())
    tmp_so = d / f".k_{key}.{os.getpid()}.so"
    cmd = [options.cxx, *options.cpp_flags, str(cpp), "-o", str(tmp_so), *options.link_flags]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise CppCompileError(f"g++ failed to compile generated kernels ({cpp}):\n{proc.stderr[-4000:]}\n"
                              "This is a kiln bug; please report it with the source above.")
    os.replace(tmp_so, d / so_name)
    return d / so_name, dt
